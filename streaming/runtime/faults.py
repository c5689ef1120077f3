"""Faults for the crash-safety tests. Crash points: ``STREAMOFFLOAD_CRASH_AT=<point>[:<n>]`` SIGKILLs the
job's whole process group (driver, JVM, Python workers) the n-th time the sink reaches ``point``.

Points: ``after-part`` (mid-upload), ``after-complete`` (between data and index), ``after-index``
(between index and metadata), ``after-open`` (mid-batch, before any part). The count is kept in
files under ``STREAMOFFLOAD_CRASH_DIR`` because sink code runs in several worker processes. Unset,
this is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

POINTS = ("after-open", "after-part", "after-complete", "after-index")
JOB_PGID = "STREAMOFFLOAD_JOB_PGID"
CRASH_ARM = "STREAMOFFLOAD_CRASH_ARM"
"""Optional, with ``STREAMOFFLOAD_CRASH_AT`` set to anything: a file naming ``<point>[:<n>]``. The crash points
fire only while it exists, as it says, so a harness arms a job that is already running (bench/chaos.py's
kill inside a commit, without a Spark start-up for it); clear ``STREAMOFFLOAD_CRASH_DIR`` before arming."""


def arm_for_this_job() -> None:
    """Called by the job's main process: remember its process group for the workers, because
    PySpark's worker daemon puts Python workers in process groups of their own."""
    if os.environ.get("STREAMOFFLOAD_CRASH_AT"):
        os.environ.setdefault(JOB_PGID, str(os.getpgrp()))


def group_alive(pgid: int) -> bool:
    """Whether a live process is in process group ``pgid``. Zombies do not count: a killed job's JVM can
    stay a zombie for a while (its parent, the driver, died with it), and a Python worker left over from
    that job must not take it for a live job and crash the next one's run."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: signal 0 (which zombies pass) is the best available
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def crash_point(name: str) -> None:
    spec = os.environ.get("STREAMOFFLOAD_CRASH_AT")
    if not spec:
        return
    arm = os.environ.get(CRASH_ARM)
    if arm:
        try:
            spec = Path(arm).read_text().strip()
        except OSError:
            return  # not armed now
    point, _, nth = spec.partition(":")
    if point != name:
        return
    job_group = int(os.environ.get(JOB_PGID, os.getpgrp()))
    if not group_alive(job_group):
        return  # a worker left over from a job that was already killed: not the job under test
    directory = Path(os.environ.get("STREAMOFFLOAD_CRASH_DIR", "/tmp/streamoffload-crash"))
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "crashed").exists():
        return
    # One byte per arrival, appended atomically: the file size is the count across processes.
    fd = os.open(directory / f"count-{point}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    if os.path.getsize(directory / f"count-{point}") >= int(nth or 1):
        (directory / "crashed").write_text(point)
        os.killpg(job_group, signal.SIGKILL)
        # A Python worker lives in a process group of its own: without this it would go on past the
        # crash point (and, say, commit the segment it was meant to crash before).
        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# The window between the source's read and the sink's fetch (tests/streaming/job/test_fetch_faults.py).

FETCH_FAULT = "STREAMOFFLOAD_FETCH_FAULT"
"""``kind=topic-substring,...``: the sink's fetches of each matching topic-partition see the broker's second
read differ from the first. Kinds: ``flip`` (one bit of the first entry), ``resize`` (the first entry one byte
longer), ``drop`` (the first entry gone, as after a retention trim), each on every fetch; ``pause`` (once per
topic, a marker in ``STREAMOFFLOAD_CRASH_DIR``: wait until the file ``resume`` appears there, so a test can
restart the broker between the two reads)."""
FETCH_FAULT_KINDS = ("flip", "resize", "drop", "pause")


def fetch_fault(topic: str) -> str | None:
    """The fault this fetch of ``topic`` must see, if one is armed and not yet used."""
    spec = os.environ.get(FETCH_FAULT)
    if not spec:
        return None
    directory = Path(os.environ.get("STREAMOFFLOAD_CRASH_DIR", "/tmp/streamoffload-crash"))
    for item in spec.split(","):
        kind, _, needle = item.strip().partition("=")
        if kind not in FETCH_FAULT_KINDS or not needle or needle not in topic:
            continue
        if kind != "pause":
            return kind
        directory.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(directory / f"fetch-pause-{needle}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        resume = directory / "resume"
        deadline = time.monotonic() + 120
        while not resume.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return None


def with_fetch_fault(kind: str | None, delivered: Iterator[tuple[Any, bytes]]) -> Iterator[tuple[Any, bytes]]:
    """``delivered`` with ``kind`` done to its first entry."""
    first = True
    for position, data in delivered:
        if first and kind is not None:
            first = False
            if kind == "drop":
                continue
            if kind == "flip":
                flipped = bytearray(data)
                flipped[len(flipped) // 2] ^= 0x10
                data = bytes(flipped)
            elif kind == "resize":
                data = data + b"\0"
        yield position, data
