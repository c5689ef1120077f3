"""Crash points must only ever kill the job that armed them: a worker left over from a killed job sees
that job as dead even while its JVM is still a zombie."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from streamoffload.streaming.runtime.faults import CRASH_ARM, group_alive


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


def test_an_armable_crash_point_fires_only_while_its_arm_file_names_it(tmp_path: Path) -> None:
    """bench/chaos.py arms a running job: the crash (SIGKILL of its group) comes at the named point only."""
    arm, crash_dir = tmp_path / "arm", tmp_path / "crash"
    script = (
        "import sys, time\n"
        "from streamoffload.streaming.runtime.faults import arm_for_this_job, crash_point\n"
        "arm_for_this_job()\n"
        "for _ in range(300):\n"
        "    crash_point('after-index')\n"
        "    time.sleep(0.01)\n"
        "sys.exit(7)\n"
    )
    env = {
        **os.environ,
        "STREAMOFFLOAD_CRASH_AT": "armed",
        CRASH_ARM: str(arm),
        "STREAMOFFLOAD_CRASH_DIR": str(crash_dir),
    }
    # Not armed, or armed for another point: the process runs to its end.
    arm.write_text("after-part:1")
    assert subprocess.run([sys.executable, "-c", script], env=env, start_new_session=True).returncode == 7
    arm.unlink()
    assert subprocess.run([sys.executable, "-c", script], env=env, start_new_session=True).returncode == 7
    arm.write_text("after-index:1")
    assert subprocess.run([sys.executable, "-c", script], env=env, start_new_session=True).returncode == -9
    assert (crash_dir / "crashed").read_text() == "after-index"
