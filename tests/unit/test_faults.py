"""Crash points must only ever kill the job that armed them: a worker left over from a killed job sees
that job as dead even while its JVM is still a zombie."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from streamoffload.streaming.faults import group_alive


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode()
    return raw[raw.rindex(")") + 2 :].split()[0]


def test_a_group_of_only_a_zombie_is_dead_though_signal_0_reaches_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while _state(child.pid) != "Z":  # exited, not yet reaped: a zombie leading its own group
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        os.killpg(child.pid, 0)  # what the old check asked: it says the group exists
        assert not group_alive(child.pid)
    finally:
        child.wait()


def test_a_group_with_a_running_process_is_alive_and_a_gone_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert group_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not group_alive(child.pid)
    assert group_alive(os.getpgrp())
