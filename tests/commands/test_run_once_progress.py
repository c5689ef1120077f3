"""``run --once`` on a terminal: its bars move while a micro-batch runs (from the sink tasks' progress files), not
only when one ends, and their last frame says exactly what the store received; in a pipe it draws nothing.

A real ``run --once`` (Spark, in a subprocess whose standard error is a pty) over a backlog of several
micro-batches (a small ``maxBytesPerTrigger``), the upload limited so that each micro-batch's sink takes a second
or two. (The total across ledgers: ``tests/streaming/source/test_backlog_count.py``.)"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.commands.test_cli_progress import read_all
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import write_job_config

TOTAL = re.compile(r"all topic-partitions .*? (\d+)/(\d+) +entries")
FINAL = re.compile(r"(\d+)/(\d+) +entries .* ([\d,]+) bytes, [\d.]+ MB/s")


def test_run_once_progress_moves_within_a_micro_batch(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    broker = make_broker(default_partitions=0)
    topics = [unique_topic("bar-a"), unique_topic("bar-b")]
    produce(broker.service_url, topics, count=120, payload_size=2000, batching=False)

    config = write_job_config(tmp_path, broker.service_url, topics=topics, pulsar="max_bytes_per_trigger = 200000")
    # Each topic-partition's segments (30 kB) at 30 kB/s: a micro-batch of ~100 kB a topic-partition takes the sink
    # ~3 s, a segment written every second.
    config.write_text(config.read_text() + "offloadUploadRateBytesPerSecond = 30000\n")
    command = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config)]
    env = {**os.environ, "COLUMNS": "220", "TERM": "xterm"}
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, env=env, start_new_session=True)
    finally:
        os.close(slave)
    try:
        err = read_all(master)
        (tmp_path / "terminal.txt").write_text(err)  # what the terminal showed, for a failure's reader
        assert proc.wait(timeout=300) == 0, err[-3000:]
    finally:
        os.close(master)

    meta = MetadataStore(ScopedStore(FilesystemStore(tmp_path / "store", fsync=False)))
    stored = {tp: meta.offloaded_segments(tp) for tp in topics}
    entries = {tp: sum(m.entries for m in segments) for tp, segments in stored.items()}
    nbytes = {tp: sum(m.entryBytes for m in segments) for tp, segments in stored.items()}
    assert entries == dict.fromkeys(topics, 120)

    shown = [(int(done), int(total)) for done, total in TOTAL.findall(err)]
    assert shown and all(total == 240 for _, total in shown), shown[-5:]  # the backlog's total, exact
    batches = len(list((tmp_path / "checkpoint").glob("**/commits/[0-9]*")))
    assert batches >= 3, batches  # the backlog spans several micro-batches
    # Counted only at a micro-batch's end, the bar would show at most one figure per micro-batch.
    moving = sorted({done for done, _ in shown if 0 < done < 240})
    assert len(moving) > batches, (moving, batches)

    final = err[err.rindex("all topic-partitions") :].splitlines()[:3]  # the last frame: the total, each topic
    assert FINAL.search(final[0]) is not None, final
    assert FINAL.findall(final[0])[0] == ("240", "240", f"{sum(nbytes.values()):,}"), final
    for line, tp in zip(final[1:], sorted(topics), strict=True):
        assert tp in line and FINAL.findall(line)[0] == ("120", "120", f"{nbytes[tp]:,}"), final
    assert not list((tmp_path / "checkpoint").glob("progress-*"))  # the run's progress files are gone


def test_run_once_draws_no_progress_in_a_pipe(make_broker: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    broker = make_broker(default_partitions=0)
    topic = unique_topic("bar-pipe")
    produce(broker.service_url, topic, count=20, payload_size=100, batching=False)
    config = write_job_config(tmp_path, broker.service_url, topics=[topic])
    command = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "TERM": "xterm"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "entries" not in done.stderr and "ETA" not in done.stderr and "\x1b[" not in done.stderr
    assert "offloaded everything available into" in done.stderr
    assert not list((tmp_path / "checkpoint").glob("progress-*"))
