"""Progress is drawn on a terminal (a pty) and nowhere else: `cleanup` and `verify` in a subprocess whose standard
error is a pty or a pipe, `run --once`'s listener fed the micro-batch reports the job gives it, and the backlog
`run --once` finds against the embedded broker (no Spark: `run --once` itself is measured by hand, in the report)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.commands.run import OnceProgress, backlog_at_start
from streamoffload.config import load_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.progress import Progress
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.status import latest_positions
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.report import BatchReport
from streamoffload.streaming.sink.sink import SinkStats
from streamoffload.streaming.source.backlog import BacklogCount
from tests.commands.test_cli_json import leaky_store
from tests.fixtures import reports
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import write_job_config

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_all(fd: int) -> str:
    """What was written to a pty's other side, until it is closed."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def run_with_stderr(argv: list[str], *, on_pty: bool) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``streamoffload ARGV``, its stderr a pty or a pipe."""
    command = [sys.executable, "-m", "streamoffload", *argv]
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    if not on_pty:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, text=True, env=env)
    finally:
        os.close(slave)
    try:
        err = read_all(master)
        out = proc.stdout.read() if proc.stdout else ""
        return proc.wait(timeout=120), out, err
    finally:
        os.close(master)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("progress") / "store"
    leaky_store(root)
    return root


@pytest.mark.parametrize(
    ("argv", "bar"),
    [
        (["cleanup", "--grace-minutes", "1", "--dry-run"], "cleanup"),
        (["verify"], "verify"),
    ],
)
def test_progress_on_a_terminal_and_not_in_a_pipe(store: Path, argv: list[str], bar: str) -> None:
    command = [argv[0], "--store", str(store), *argv[1:]]
    code, out, err = run_with_stderr(command, on_pty=True)
    assert re.search(rf"{bar} .*1/1 topic-partitions", err), err
    if bar == "verify":  # and the segments of the store's one live segment, with its data bytes (1 MB)
        assert re.search(r"segments .*1/1 +segments .*1\.0 of 1\.0 MB listed", err), err
    piped_code, piped_out, piped_err = run_with_stderr(command, on_pty=False)
    assert (piped_code, piped_out) == (code, out)  # stdout is the same either way
    assert "topic-partitions" not in piped_err and "ETA" not in piped_err
    if bar == "cleanup":
        assert code == 0 and piped_err == ""


def test_quiet_draws_no_progress_on_a_terminal(store: Path) -> None:
    _, _, err = run_with_stderr(["cleanup", "--store", str(store), "--dry-run", "-q"], on_pty=True)
    assert "topic-partitions" not in err


def report(batch_id: int, figures: dict[str, tuple[int, int]]) -> BatchReport:
    topics = {t: reports.figures(t, batch_entries=e, batch_bytes=b) for t, (e, b) in figures.items()}
    return BatchReport(batch_id, 1.0, SinkStats(topics=topics))


def test_run_once_progress_counts_entries_and_bytes_of_the_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w", encoding="utf-8", closefd=True)
    p0, p1 = "persistent://public/default/t-partition-0", "persistent://public/default/t-partition-1"
    backlog: dict[str, BacklogCount | None] = {p0: BacklogCount(300, 3_000_000), p1: None}
    try:
        with Progress("all topic-partitions", total=None, unit="entries", stream=terminal) as progress:
            assert progress.shown
            with OnceProgress(progress, backlog) as listener:  # no progress files: the reports, batch by batch
                listener(report(0, {p0: (100, 1_000_000), p1: (50, 500_000)}))
                listener(report(1, {p0: (200, 2_000_000)}))
        terminal.close()
        text = read_all(master)
    finally:
        os.close(master)
    final = text.splitlines()[-3:]  # the last frame: the total, then each topic-partition
    assert re.search(r"all topic-partitions .* 350/\? +entries .* 3,500,000 bytes, [\d.]+ MB/s", final[0]), final
    assert re.search(rf"{p0} .* 300/300 entries +100% +3,000,000 bytes, ", final[1]), final
    assert re.search(rf"{p1} .* 50/\? +entries .* 500,000 bytes, ", final[2]), final
    assert "ETA 0:00:00" in final[1] and "ETA" not in final[2]  # an estimate only where the backlog is known


def test_progress_is_off_in_a_pipe(tmp_path: Path) -> None:
    with (tmp_path / "log").open("w") as log, Progress("verify", total=3, stream=log) as progress:
        assert not progress.shown
        progress.advance(1)
        progress.line("a line")
    assert (tmp_path / "log").read_text() == ""


def committed_segment(meta: MetadataStore, topic: str, end: tuple[int, int]) -> None:
    """A committed segment of ``topic`` holding its entries ``end[0]:0..end[1]``: the store's position for the job."""
    seg_id = mf.segment_uuid(topic, 0, (end[0], 0))
    opened = mf.new_manifest(
        topic=topic,
        segment_id=seg_id,
        ordinal=0,
        format_version=2,
        start=(end[0], 0),
        assigned_ms=1,
        data_key=keys.data_key("", topic, seg_id),
        index_key=keys.index_key("", topic, seg_id),
    )
    done = mf.sealed_manifest(
        opened,
        end=end,
        offloaded_ms=2_000,
        spans=[mf.LedgerSpan(end[0], 0, end[1], end[1] + 1, 100 * (end[1] + 1))],
        data_length=100 * (end[1] + 1),
        index_length=8,
        block_count=1,
        part_count=1,
        seal_reason="size",
        publish_time_last=1_000,
    )
    meta.store.put(done.dataKey, b"d")
    meta.store.put(done.indexKey, b"i")
    meta.commit(done)


def test_run_once_finds_the_backlog_of_each_topic_partition(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """What the job's store holds against the broker's latest positions: the entries after the store's last
    position, and all of a topic-partition the store has nothing of (``starting_offsets = "earliest"``), each with
    its bytes (here every entry's size is the same, the probed one)."""
    stored, fresh = unique_topic("progress-stored"), unique_topic("progress-fresh")
    produce(pulsar_broker.service_url, [stored, fresh], count=30, payload_size=64, batching=False)
    latest = latest_positions(pulsar_broker.service_url, [stored, fresh])
    ledger, last = latest[stored] or (-1, -1)
    assert last == 29
    config_path = write_job_config(tmp_path, pulsar_broker.service_url, topics=[stored, fresh])
    committed_segment(MetadataStore(ScopedStore(FilesystemStore(tmp_path / "store", fsync=False))), stored, (ledger, 9))
    job = OffloadJob(load_config(config_path), str(config_path))
    client = rr.RawClient(pulsar_broker.service_url, {})
    # An entry's size (metadata, properties and 64 bytes of payload) grows with its 'seq' property's digits: the
    # first entry is the smallest, the last the largest.
    sizes = [rr.probe_after_raw(client, stored, after) for after in (BEFORE_EARLIEST, (ledger, 28))]
    smallest, largest = (probe.approx_bytes if probe else 0 for probe in sizes)
    assert 64 < smallest < largest
    job.begin_run()
    try:
        backlog = backlog_at_start(job, job.broker_latest())
        assert sorted(backlog) == sorted([stored, fresh])
        assert (backlog[stored].entries, backlog[fresh].entries) == (20, 30)  # type: ignore[union-attr]
        assert backlog[stored].bytes == 20 * largest  # type: ignore[union-attr]  # entries 10..29: 2-digit seqs
        assert 30 * smallest < backlog[fresh].bytes < 30 * largest  # type: ignore[union-attr]
        assert backlog_at_start(job, None) == {}  # the broker could not be asked: bars without totals
    finally:
        job.end_run()


def test_run_once_progress_says_what_was_read_ahead_of_the_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a micro-batch's source stage reads (into the spool) and its sink has written nothing yet, the note says
    the bytes read: the spool files' size, their records' headers taken off by the backlog's mean entry size."""
    from streamoffload.streaming.handoff.spool import RECORD_HEADER_BYTES, topic_dir

    monkeypatch.setenv("COLUMNS", "200")
    p0 = "persistent://public/default/t-partition-0"
    spool = tmp_path / "spool"
    topic_dir(spool, p0).mkdir(parents=True)
    (topic_dir(spool, p0) / ".-1_-1_0_99.spool.1.tmp").write_bytes(b"x" * (100 * (980 + RECORD_HEADER_BYTES)))
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w", encoding="utf-8", closefd=True)
    try:
        with Progress("all topic-partitions", total=None, unit="entries", stream=terminal) as progress:
            once = OnceProgress(progress, {}, str(tmp_path / "progress"), str(spool))
            once.set_backlog({p0: BacklogCount(200, 196_000)})  # counted while the job starts: totals come late
            assert once.spooled(p0) == 98_000  # 100 entries of 980 bytes
            once.refresh()
        terminal.close()
        text = read_all(master)
    finally:
        os.close(master)
    assert re.search(r"all topic-partitions .* 0/200 +entries .* 0\.0 of ~0\.2 MB \(read 0\.1\), ", text), text
