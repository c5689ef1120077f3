"""End to end: publish with pulsar-client into the embedded broker, run the offload job on local Spark,
read everything back from the store byte for byte."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import submit_requests
from streamoffload.checkpoints.keyring import encryption_key_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.produce import expected_payload, produce
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.storage.s3 import S3Store
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.source.admission import BUFFER_FILE_PREFIX
from tests.fixtures.broker import partition_names, unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, check_messages, fs_store, poll, wait_for_policy, write_config
from tests.fixtures.readback import read_entries, read_messages, referenced_keys, store_keys

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def min_part_used(tmp_path: Path) -> int:
    """The part size the job ran its segmenter with (the store's ``part_size``), as it told the source (the run's
    buffer file)."""
    [buffer_file] = (tmp_path / "checkpoint").glob(f"{BUFFER_FILE_PREFIX}*.json")
    return int(json.loads(buffer_file.read_text())["min_part_size"])


def test_once_offloads_batched_and_unbatched_traffic_across_a_ledger_rollover(
    spark: Any, pulsar_broker: Any, rollover_topic: tuple[str, int], tmp_path: Path
) -> None:
    base = unique_topic("orders")
    partitioned = partition_names(base, 3)
    plain = unique_topic("audit")
    rolled, rolled_count = rollover_topic  # 50,000+ unbatched entries: crosses a ledger rollover
    produce(pulsar_broker.service_url, partitioned, count=300, payload_size=200, keys=7, batching=True, batch_size=20)
    produce(pulsar_broker.service_url, plain, count=200, payload_size=300, batching=False)

    extra = SMALL_SEGMENTS.replace("0.03", "0.25").replace("8192", "65536")
    config_path = write_config(
        tmp_path, pulsar_broker.service_url, [*partitioned, plain, rolled], fs_store(tmp_path), extra
    )
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    assert min_part_used(tmp_path) == FilesystemStore.part_size

    store = config.store.location.open().store
    meta = MetadataStore(ScopedStore(store))
    for topic in [*partitioned, plain, rolled]:
        segments = meta.offloaded_segments(topic)
        assert segments, topic
        assert all(s.dataLength <= config.policy_for(topic).max_segment_bytes for s in segments)
        assert all(m.status == mf.OFFLOADED for m in meta.manifests(topic))
    for topic in partitioned:
        check_messages(ScopedStore(store), topic, 300, keys=7, size=200)
        assert any(m.batch_index > 0 for m in read_messages(ScopedStore(store), topic)), (
            "batched entries hold several messages"
        )
    check_messages(ScopedStore(store), plain, 200, keys=0, size=300)
    assert all(m.batch_index == -1 for m in read_messages(ScopedStore(store), plain))

    entries = read_entries(ScopedStore(store), rolled)
    assert len(entries) == rolled_count
    ledgers = sorted({ledger for ledger, _, _ in entries})
    assert len(ledgers) == 2, f"{rolled} should span a ledger rollover, got ledgers {ledgers}"
    assert any(len(s.ledgers) == 2 for s in meta.offloaded_segments(rolled)), "a segment spans both ledgers"
    check_messages(ScopedStore(store), rolled, rolled_count, keys=0, size=16)

    # Deletion: marking the first ledger deletes exactly the segments that hold only that ledger.
    topic = rolled
    first_ledger = ledgers[0]
    before = meta.offloaded_segments(topic)
    only_first = [s for s in before if {i.ledgerId for i in s.ledgers} == {first_ledger}]
    assert only_first
    meta.mark_ledger_deleted(topic, first_ledger, "test")
    deleted = meta.apply_deletions(topic, lag_ms=0)
    assert {mf.manifest_uuid(s) for s in deleted} == {mf.manifest_uuid(s) for s in only_first}
    for seg in only_first:
        assert not store.exists(seg.dataKey) and not store.exists(seg.indexKey)
    remaining = meta.offloaded_segments(topic)
    assert len(remaining) == len(before) - len(only_first)
    assert any(first_ledger in {i.ledgerId for i in s.ledgers} for s in remaining), "mixed segment kept"


@pytest.mark.s3
def test_once_to_s3(spark: Any, pulsar_broker: Any, tmp_path: Path, moto_server: str, s3_bucket: str) -> None:
    topic = unique_topic("s3")
    produce(pulsar_broker.service_url, topic, count=400, payload_size=500, keys=3, batching=True, batch_size=25)
    store = (
        f'[store]\nmanagedLedgerOffloadDriver = "s3"\nbucket = "{s3_bucket}"\nprefix = "offload/v1"\n'
        f'serviceEndpoint = "{moto_server}"\nregion = "us-east-1"\npathStyle = true'
    )
    extra = SMALL_SEGMENTS.replace("8192", "65536").replace("0.03", "0.1")
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], store, extra)
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    assert min_part_used(tmp_path) == S3Store.part_size == S3Store.min_part_size
    s3 = config.store.location.open().store
    assert len(MetadataStore(ScopedStore(s3, "offload/v1")).offloaded_segments(topic)) >= 2
    check_messages(ScopedStore(s3, "offload/v1"), topic, 400, keys=3, size=500)
    assert MetadataStore(ScopedStore(s3, "offload/v1")).cleanup(topic, grace_ms=0).total == 0
    assert not list(s3.pending_multiparts(""))


IDLE_EVENTS_CONF = "spark.sql.streaming.noDataProgressEventInterval"
"""How often a query tells its listeners that a trigger ran no micro-batch (Spark's default: at most every 10 s)."""


class Triggers(StreamingQueryListener):
    """Each query's triggers, in order, as Spark's listener bus tells them: a micro-batch (its batch id, once it
    ended) or a trigger that ran none (``None``; every one while :data:`IDLE_EVENTS_CONF` is 0)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[int | None]] = {}

    def _add(self, query: str, batch: int | None) -> None:
        with self._lock:
            self._events.setdefault(query, []).append(batch)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self._add(str(event.progress.id), int(event.progress.batchId))

    def onQueryIdle(self, event: Any) -> None:
        self._add(str(event.id), None)

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def _after(self, query: str, batch: int) -> list[int | None]:
        with self._lock:
            events = list(self._events.get(query, []))
        return events[events.index(batch) + 1 :] if batch in events else []

    def idle_after(self, query: str, batch: int) -> int:
        """Triggers that ran nothing since ``batch`` ended."""
        return sum(1 for e in self._after(query, batch) if e is None)

    def batches_after(self, query: str, batch: int) -> list[int]:
        return [e for e in self._after(query, batch) if e is not None]


@pytest.fixture
def triggers(spark: Any) -> Iterator[Triggers]:
    """A :class:`Triggers` listening to the queries started meanwhile, told of every idle trigger."""
    listener = Triggers()
    previous = spark.conf.get(IDLE_EVENTS_CONF)
    spark.conf.set(IDLE_EVENTS_CONF, "0")  # read as a query starts
    spark.streams.addListener(listener)
    yield listener
    spark.streams.removeListener(listener)
    spark.conf.set(IDLE_EVENTS_CONF, previous)


def test_continuous_job_seals_by_time_on_request_and_on_method_switch(
    triggers: Triggers, running_job: Callable[[Path], OffloadJob], pulsar_broker: Any, tmp_path: Path
) -> None:
    quiet, busy = unique_topic("quiet"), unique_topic("busy")
    policy = (
        SMALL_SEGMENTS
        + f"""
[topics."{quiet}"]
maxOffloadSegmentRolloverTimeSeconds = 3
"""
    )
    config_path = write_config(tmp_path, pulsar_broker.service_url, [quiet, busy], fs_store(tmp_path), policy)
    config = load_config(config_path)
    meta = MetadataStore(config.store.location.open())
    job = running_job(config_path)
    seals: list[int] = []
    job.listeners.append(lambda report: seals.extend([report.batch_id] * len(report.stats.sealed)))

    # A quiet topic's open segment is sealed by time with no further traffic.
    produce(pulsar_broker.service_url, quiet, count=20, payload_size=100, batching=False)
    [sealed] = poll(lambda: meta.offloaded_segments(quiet), what="the quiet topic's segment sealed by time")
    assert sealed.sealReason == "time" and sealed.entries == 20

    # With no timer pending and nothing new, the job runs no micro-batch (Spark would run one at every
    # trigger for processing-time timers: offset_planner's WAKE_KEY plans them only when a timer is due):
    # the seal's micro-batch is the last one, three triggers after it.
    [seal_batch] = poll(lambda: seals, what="the seal's batch report")
    query = str(job.query.id)
    poll(lambda: triggers.idle_after(query, seal_batch) >= 3, what="three idle triggers after the seal")
    assert triggers.batches_after(query, seal_batch) == [], "no micro-batch after the seal"

    # offload-now seals the busy topic's open segment at once (its rollover is 10 minutes).
    phases = [produce(pulsar_broker.service_url, busy, count=30, payload_size=100, batching=False)]
    # Below one part, the open segment waits in the job's state, with nothing in the store yet (DESIGN, step 1).
    poll(lambda: _open_entries(job, busy) == 30, what="an open segment of 30 entries")
    assert meta.manifests(busy) == []
    submit_requests(config.store.location.open(), [busy])
    [manual] = poll(lambda: meta.offloaded_segments(busy), what="the manual seal")
    assert manual.sealReason == "manual" and manual.entries == 30

    # Switching the topic to ledger-based offload completes the open streaming segment first.
    phases.append(produce(pulsar_broker.service_url, busy, count=10, payload_size=100, batching=False))
    poll(lambda: _open_entries(job, busy) == 10, what="ten entries in a new open segment")
    config_path.write_text(config_path.read_text() + f'\n[topics."{busy}"]\nmethod = "ledger"\n')
    wait_for_policy(job, '"ledger"')
    phases.append(produce(pulsar_broker.service_url, busy, count=10, payload_size=100, batching=False))
    switched = poll(
        lambda: [s for s in meta.offloaded_segments(busy) if s.sealReason == "method-switch"],
        what="the method-switch seal",
    )
    assert switched[0].formatVersion == 2 and switched[0].entries == 10
    poll(lambda: _open_entries(job, busy) == 10, what="the ledger-mode segment")
    submit_requests(config.store.location.open(), [busy])
    poll(lambda: any(s.formatVersion == 1 for s in meta.offloaded_segments(busy)), what="a v1 segment")
    # The mixed v2/v1 history reads back whole: each segment holds exactly one phase's entries, at the
    # positions the broker acknowledged, with the payloads published (each phase numbers from 0).
    segments = meta.offloaded_segments(busy)
    assert [s.formatVersion for s in segments] == [2, 2, 1]
    acked = [(p.partitions[busy].first_message_id, p.partitions[busy].last_message_id) for p in phases]
    assert [(mf.start_position(s), mf.end_position(s)) for s in segments] == [(a[:2], b[:2]) for a, b in acked]
    want = [(a[0], e, -1) for a, b in acked for e in range(a[1], b[1] + 1)]
    got = read_messages(config.store.location.open(), busy)
    assert [(m.ledger_id, m.entry_id, m.batch_index) for m in got] == want
    payloads = [expected_payload(busy, seq, 100) for p in phases for seq in range(p.partitions[busy].messages)]
    assert [m.payload for m in got] == payloads


def _open_entries(job: OffloadJob, topic: str) -> int:
    stats = job.last_topic_stats.get(topic)
    return -1 if stats is None else stats.open_segment_entries


CRASH_POINTS = ("after-open:2", "after-part:3", "after-complete", "after-index")
"""Every crash point of the sink (streaming/runtime/faults.py), earliest (most work left) first."""
ALWAYS_CRASHED = ("after-index",)
"""Crashed at in every run: data and index written, the metadata not yet (a recovery must neither lose nor
rewrite the segment). after-part is also crashed at in every run by test_store_truth_e2e's policy-edit test."""


CRASH_SEED_ENV = "STREAMOFFLOAD_CRASH_SEED"
"""Names the seed the crash sweep draws its points from (an integer); unset, a random seed, printed."""


def crash_seed() -> int:
    """The crash sweep's seed: ``STREAMOFFLOAD_CRASH_SEED`` if set, else a fresh random one (the sweep prints it, so
    a failing run is replayed with ``STREAMOFFLOAD_CRASH_SEED=<seed>``)."""
    given = os.environ.get(CRASH_SEED_ENV, "").strip()
    if not given:
        return random.SystemRandom().randrange(1 << 32)
    try:
        return int(given)
    except ValueError:
        raise ValueError(f"{CRASH_SEED_ENV}={given!r}: not an integer seed") from None


def crash_points_this_run(seed: int) -> tuple[str, ...]:
    """The crash points this run's sweep kills the job at: :data:`ALWAYS_CRASHED` plus one of the others, drawn
    from ``seed`` (so successive runs cover every point, and a run is replayed by its seed), in
    :data:`CRASH_POINTS`' order. Each point costs a Spark start-up (~30 s of a 2-core CI run).
    ``STREAMOFFLOAD_CRASH_POINTS=all`` (or a comma-separated list of points) sweeps those instead:
    ``STREAMOFFLOAD_CRASH_POINTS=all pytest tests/streaming/job/test_job_e2e.py -k sigkill``."""
    chosen = os.environ.get("STREAMOFFLOAD_CRASH_POINTS", "").strip()
    if chosen == "all":
        return CRASH_POINTS
    if chosen:
        wanted = {p.strip() for p in chosen.split(",")}
        unknown = wanted - set(CRASH_POINTS)
        if unknown:
            raise ValueError(f"STREAMOFFLOAD_CRASH_POINTS: unknown {sorted(unknown)}; known {CRASH_POINTS}")
        return tuple(p for p in CRASH_POINTS if p in wanted)
    rotating = [p for p in CRASH_POINTS if p not in ALWAYS_CRASHED]
    sample = {random.Random(seed).choice(rotating), *ALWAYS_CRASHED}
    return tuple(p for p in CRASH_POINTS if p in sample)


def test_the_crash_sweep_draws_from_its_seed_and_always_holds_the_commit_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAMOFFLOAD_CRASH_POINTS", raising=False)
    samples = {seed: crash_points_this_run(seed) for seed in range(40)}
    assert {p for s in samples.values() for p in s} == set(CRASH_POINTS), "some seed draws each point"
    for seed, sample in samples.items():
        assert crash_points_this_run(seed) == sample, "the same seed, the same points"
        assert set(ALWAYS_CRASHED) <= set(sample) and len(sample) == len(ALWAYS_CRASHED) + 1
        assert list(sample) == sorted(sample, key=CRASH_POINTS.index)
    monkeypatch.setenv(CRASH_SEED_ENV, "1234")
    assert crash_seed() == 1234
    monkeypatch.setenv(CRASH_SEED_ENV, "soon")
    with pytest.raises(ValueError, match=r"STREAMOFFLOAD_CRASH_SEED='soon': not an integer seed"):
        crash_seed()
    monkeypatch.delenv(CRASH_SEED_ENV)
    assert len({crash_seed() for _ in range(8)}) > 1, "unset: a fresh seed each run"


@pytest.mark.slow
def test_sigkill_at_every_crash_point_then_recovery_is_exactly_once(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLs a ``run --once`` at crash points (a sample each run: :func:`crash_points_this_run`), each restart
    recovering from the previous crash; the last recovery runs in this session's Spark (no extra start-up)."""
    topics = [unique_topic("crash-a"), unique_topic("crash-b")]
    for topic in topics:
        produce(pulsar_broker.service_url, topic, count=300, payload_size=150, keys=5, batching=True, batch_size=10)
    # crash-b is encrypted and compressed at rest: its data keys, recorded by the first attempt, must serve every
    # replay, and its parts' frame records every seal.
    keys = tmp_path / "keys.toml"
    keys.write_text(f'k1 = "{base64.b64encode(bytes(range(32))).decode()}"\n')
    keys.chmod(0o600)  # a key file is its owner's alone
    monkeypatch.setenv("STREAMOFFLOAD_KEYS_FILE", str(keys))  # this process's readers
    encrypted = f'\n[encryption]\nkeys_file = "{keys}"\n[topics."{topics[1]}"]\noffloadEncryptionKeyId = "k1"\n'
    encrypted += 'offloadCompression = "zstd"\n'
    config_path = write_config(
        tmp_path, pulsar_broker.service_url, topics, fs_store(tmp_path), SMALL_SEGMENTS + encrypted
    )
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config_path)]

    # Each restart reads again what the store has not committed, so the points go from the earliest
    # (most work left) to the latest.
    seed = crash_seed()
    points = crash_points_this_run(seed)
    print(
        f"crash points this run: {', '.join(points)} ({CRASH_SEED_ENV}={seed} replays them; "
        "STREAMOFFLOAD_CRASH_POINTS=all sweeps every one)"
    )
    for i, point in enumerate(points):
        # A crash directory per run: a Python worker of the previous, killed run may outlive it and must
        # not count (or crash) in this one.
        crash_dir = tmp_path / f"crash-{i}"
        proc = subprocess.run(
            cmd,
            env={**env, "STREAMOFFLOAD_CRASH_AT": point, "STREAMOFFLOAD_CRASH_DIR": str(crash_dir)},
            start_new_session=True,
            capture_output=True,
            timeout=300,
        )
        assert (crash_dir / "crashed").exists(), f"no crash at {point} (seed {seed}): {proc.stderr.decode()[-2000:]}"
        assert proc.returncode == -9, (proc.returncode, point, seed)

    # The last recovery runs in this session's Spark: no start-up of its own. Each crash run but the first above
    # was a recovery through the CLI (`run --once`) of the crash before it.
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)

    store = config.store.location.open().store
    meta = MetadataStore(ScopedStore(store))
    for topic in topics:
        check_messages(ScopedStore(store), topic, 300, keys=5, size=150)
        meta.cleanup(topic, grace_ms=0)
        assert all(m.status == mf.OFFLOADED for m in meta.manifests(topic))
    assert {encryption_key_id(m) for m in meta.offloaded_segments(topics[1])} == {"k1"}
    assert {encryption_key_id(m) for m in meta.offloaded_segments(topics[0])} == {None}
    assert all(mf.frame_table(m) for m in meta.offloaded_segments(topics[1]))
    assert not any(mf.frame_table(m) for m in meta.offloaded_segments(topics[0]))
    # Converged: besides metadata, the store holds exactly the offloaded segments' objects.
    data_keys = {k for k in store_keys(store) if "/_" not in k and not k.startswith("_")}
    assert data_keys == referenced_keys(ScopedStore(store), topics)
    assert not list(store.pending_multiparts(""))


def _run_checkpoint(tmp_path: Path) -> Path:
    [run] = sorted((tmp_path / "checkpoint").glob("run-*"))
    return run


@pytest.mark.slow
def test_sigkill_while_a_micro_batch_is_written_behind_the_next_ones_read_converges_exactly_once(
    spark: Any, pulsar_broker: Any, tmp_path: Path
) -> None:
    """Overlap (``spark.overlap_writes``): a ``run --once`` is SIGKILLed in the middle of micro-batch 0's writes,
    after Spark moved past that micro-batch and planned the next (its commit log holds 0, its offset log 1); the
    next run recovers from the store's commits and every entry is stored exactly once, byte for byte. The uploads
    are rate-limited in the killed run so that its writes trail its reads."""
    topics = [unique_topic("behind-a"), unique_topic("behind-b")]
    for topic in topics:
        produce(pulsar_broker.service_url, topic, count=400, payload_size=150, keys=5, batching=True, batch_size=10)
    slow = SMALL_SEGMENTS + "offloadUploadRateBytesPerSecond = 2500\n"
    config_path = write_config(tmp_path, pulsar_broker.service_url, topics, fs_store(tmp_path), slow)
    text = config_path.read_text().replace("[pulsar]\n", "[pulsar]\nmax_bytes_per_trigger = 40000\n", 1)
    config_path.write_text(text)
    crash_dir = tmp_path / "crash"
    proc = subprocess.run(
        [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config_path)],
        env={**os.environ, "STREAMOFFLOAD_CRASH_AT": "after-part:2", "STREAMOFFLOAD_CRASH_DIR": str(crash_dir)},
        start_new_session=True,
        capture_output=True,
        timeout=300,
    )
    assert (crash_dir / "crashed").exists(), f"no crash: {proc.stderr.decode()[-2000:]}"
    assert proc.returncode == -9, proc.returncode
    run = _run_checkpoint(tmp_path)
    assert (run / "commits" / "0").exists(), "Spark had moved past micro-batch 0 while its writes were in flight"
    assert (run / "offsets" / "1").exists(), "micro-batch 1 was planned (its source reading) at the kill"

    # The recovery, in this session's Spark, without the rate limit.
    config_path.write_text(text.replace("offloadUploadRateBytesPerSecond = 2500\n", ""))
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    store = config.store.location.open().store
    meta = MetadataStore(ScopedStore(store))
    for topic in topics:
        check_messages(ScopedStore(store), topic, 400, keys=5, size=150)
        meta.cleanup(topic, grace_ms=0)
        assert all(m.status == mf.OFFLOADED for m in meta.manifests(topic))
    data_keys = {k for k in store_keys(store) if "/_" not in k and not k.startswith("_")}
    assert data_keys == referenced_keys(ScopedStore(store), topics)
    assert not list(store.pending_multiparts(""))
