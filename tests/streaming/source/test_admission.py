"""Admission control bounds memory by configuration alone: a default bound per micro-batch, and the offload
buffer bound per topic-partition (``bufferFile``), in plain Python.

The planner is the real ``SourcePlanner``; only its three broker look-ups (discovery, latest positions, the
probe of the next entry) answer from an in-memory topic model. The closed loop runs the real ``Segmenter``
on what the planner admits and feeds its ``buffered_bytes`` back through the real buffer file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadMaxBytes

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.positions import Position
from streamoffload.config import DEFAULT_MAX_BYTES_PER_TRIGGER, parse_config
from streamoffload.pulsar.exactly_once import Probe
from streamoffload.streaming.governance.policy_versions import policy_document, write_versions_file
from streamoffload.streaming.handoff.actions import StatsAction
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.state import Run
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import MemoryState
from streamoffload.streaming.source import offset_planner
from streamoffload.streaming.source.admission import BufferFile, buffer_bound, buffer_file_path, write_buffer_file
from streamoffload.streaming.source.offset_planner import (
    SEALED_KEY,
    WAKE_FALLBACK_S,
    WAKE_KEY,
    SourcePlanner,
    even_share,
)
from streamoffload.streaming.source.pulsar_source import PulsarStreamReader
from streamoffload.streaming.source.source_options import SourceOptions
from streamoffload.units import MIB
from tests.fixtures.reports import figures

LEDGER = 7
A = "persistent://public/default/adm-partition-0"
B = "persistent://public/default/adm-partition-1"
C = "persistent://public/default/adm-partition-2"


class ModelPlanner(SourcePlanner):
    """``SourcePlanner`` over topics of ``count`` entries of ``size`` bytes each, all in one ledger."""

    def __init__(self, options: SourceOptions, topics: dict[str, tuple[int, int]]) -> None:
        super().__init__(options, client_factory=lambda: None)
        self.model = topics
        self.probes = 0

    def topic_partitions(self, force: bool = False) -> list[str]:
        return sorted(self.model)

    def latest_positions(self, partitions: Sequence[str]) -> dict[str, Position | None]:
        return {tp: (LEDGER, self.model[tp][0] - 1) if self.model[tp][0] else None for tp in partitions}

    def _probe(self, tp: str, after: Position) -> Probe | None:
        self.probes += 1
        count, size = self.model[tp]
        nxt = 0 if after[0] < LEDGER else after[1] + 1
        if nxt >= count:
            return None
        self._entry_size[tp] = float(size)
        return Probe((LEDGER, nxt), 1, size)


def options(**extra: str) -> SourceOptions:
    return SourceOptions.parse({"serviceUrl": "pulsar://127.0.0.1:6650", "topics": f"{A},{B},{C}", **extra})


def admitted(start: dict[str, list[int]], end: dict[str, list[int]]) -> dict[str, int]:
    """Entries admitted per topic-partition (one ledger)."""
    return {tp: end[tp][1] - start.get(tp, [-1, -1])[1] for tp in end}


def small_messages(doc: dict) -> dict:
    """The document for a broker taking messages of at most 1 KiB, so blocks of 4 KiB are accepted."""
    return {**doc, "pulsar": {**doc.get("pulsar", {}), "max_message_size": 1024}}


def versions_file(tmp_path: Path, doc: dict) -> str:
    path = str(tmp_path / "policy-versions.json")
    write_versions_file(path, [(0, policy_document(parse_config(small_messages(doc))))])
    return path


# --- the default bound per micro-batch ---------------------------------------------------------------


def test_the_job_bounds_every_micro_batch_by_default(tmp_path: Path) -> None:
    config = parse_config(
        {"pulsar": {"topics": [A]}, "spark": {"checkpoint": str(tmp_path / "cp")}, "metrics": {"address": ""}}
    )
    assert config.pulsar.max_bytes_per_trigger == DEFAULT_MAX_BYTES_PER_TRIGGER == 1024 * MIB
    job = OffloadJob(config)
    opts = job.source_options()
    assert opts["maxBytesPerTrigger"] == str(DEFAULT_MAX_BYTES_PER_TRIGGER)
    reader = PulsarStreamReader(opts)
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxBytes) and limit.max_bytes == DEFAULT_MAX_BYTES_PER_TRIGGER

    # 4 GiB of 128 KiB entries over 4 topic-partitions: the first micro-batch takes 1 GiB, not 4 GiB.
    size = 128 * 1024
    model = {f"persistent://public/default/big-partition-{i}": (8192, size) for i in range(4)}
    planner = ModelPlanner(SourceOptions.parse({**opts, "topics": ",".join(model)}), model)
    start = planner.initial_offset()
    end = planner.latest_offset(start, None, limit.max_bytes)
    counts = admitted(start, end)
    assert sum(counts.values()) * size <= DEFAULT_MAX_BYTES_PER_TRIGGER
    assert sorted(counts.values()) == [2048] * 4  # split fairly: 256 MiB each


def test_run_once_reads_to_its_start_positions_with_the_seal_markers_in_the_last_micro_batch(tmp_path: Path) -> None:
    config = parse_config({"pulsar": {"topics": [A]}, "spark": {"checkpoint": str(tmp_path / "cp")}})
    job = OffloadJob(config)
    job.run = Run(epoch=3, resume={}, checkpoint=str(tmp_path / "cp" / "run-3"), policy_log=None, published={})  # type: ignore[arg-type]
    once = job.source_options(seal_at_end=True)
    assert once["sealAtEnd"] == "true" and "sealAtEnd" not in job.source_options()
    assert once["maxBytesPerTrigger"] == job.source_options()["maxBytesPerTrigger"]

    planner = ModelPlanner(SourceOptions.parse({**once, "topics": f"{A},{B}"}), {A: (10, 100), B: (0, 100)})
    planner.prepare_available_now()
    start = planner.initial_offset()
    sealed = planner.latest_offset(start, None, None)
    # The whole target in one micro-batch: its seal markers come with its entries.
    assert sealed == {A: [LEDGER, 9], B: [-1, -1], SEALED_KEY: True}
    assert list(sealed)[-1] == SEALED_KEY  # topic-partitions sorted first: the JSON text is canonical
    assert planner.latest_offset(sealed, None, None) == sealed  # then nothing more: the query ends

    reader = PulsarStreamReader({**once, "topics": f"{A},{B}"})
    parts = reader.partitions(start, sealed)
    assert [type(p).__name__ for p in parts] == ["PulsarRangePartition", "SealMarkerPartition"]
    assert reader.partitions(sealed, sealed) == []
    assert parts[1].topics == [A, B]  # every topic-partition, open segment or not (the rows: tests/streaming/job)


def test_run_once_over_several_micro_batches_seals_in_the_one_that_reaches_the_target() -> None:
    size = 1000
    planner = ModelPlanner(options(sealAtEnd="true"), {A: (10, size), B: (4, size), C: (0, size)})
    planner.prepare_available_now()
    offsets = [planner.initial_offset()]
    while True:
        nxt = planner.latest_offset(offsets[-1], None, 3 * size)
        if nxt == offsets[-1]:
            break
        offsets.append(nxt)
    # 14 entries, about 3 per micro-batch; only the last micro-batch carries the markers.
    assert [SEALED_KEY in o for o in offsets[1:]] == [False] * (len(offsets) - 2) + [True]
    assert {A: offsets[-1][A], B: offsets[-1][B]} == {A: [LEDGER, 9], B: [LEDGER, 3]}
    assert len(offsets) >= 5  # several micro-batches, the last of them read entries too:
    assert any(offsets[-1][tp] != offsets[-2].get(tp) for tp in (A, B))


@given(st.integers(1, 10**7), st.integers(1, 10**7))
def test_an_even_share_takes_no_more_and_needs_no_more_micro_batches(available: int, allowed: int) -> None:
    share = even_share(available, allowed)
    if allowed >= available:
        assert share == allowed  # one micro-batch takes it all: nothing to split
        return
    assert share is not None and 1 <= share <= allowed
    batches = -(-available // allowed)
    assert -(-available // share) == batches  # as many micro-batches as before, each at most one entry apart
    assert share * batches - available < batches


def test_run_once_splits_what_is_left_evenly_over_its_micro_batches() -> None:
    size = 1000
    planner = ModelPlanner(options(sealAtEnd="true", topics=A), {A: (10, size)})
    planner.prepare_available_now()
    start = planner.initial_offset()
    first = planner.latest_offset(start, None, 7 * size)  # 7 of 10 allowed: 5 and 5, not 7 and 3
    second = planner.latest_offset(first, None, 7 * size)
    assert (first[A], second[A]) == ([LEDGER, 4], [LEDGER, 9])
    assert SEALED_KEY not in first and second[SEALED_KEY] is True
    continuous = ModelPlanner(options(topics=A), {A: (10, size)})  # a moving end: as much as allowed
    assert continuous.latest_offset(continuous.initial_offset(), None, 7 * size)[A] == [LEDGER, 6]


def test_seal_markers_only_after_entries_were_read() -> None:
    planner = ModelPlanner(options(sealAtEnd="true"), {A: (0, 100), B: (0, 100), C: (0, 100)})
    planner.prepare_available_now()
    start = planner.initial_offset()
    assert planner.latest_offset(start, None, None) == start  # nothing read: nothing open, nothing to seal
    continuous = ModelPlanner(options(sealAtEnd="true"), {A: (5, 100), B: (0, 100), C: (0, 100)})
    first = continuous.latest_offset(continuous.initial_offset(), None, None)
    assert continuous.latest_offset(first, None, None) == first  # without AvailableNow: no markers


# --- the offload buffer bound ---------------------------------------------------------------------------


def test_bound_is_at_least_one_block_plus_one_minimum_part() -> None:
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096, offloadBufferMaxBytes=4096)
    assert buffer_bound(policy, 1) == 4097
    assert buffer_bound(policy, 5 * MIB) == 4096 + 5 * MIB
    assert buffer_bound(OffloadPolicy(), 5 * MIB) == 128 * MIB  # the defaults: 64 MiB blocks, 128 MiB bound


def test_a_topic_at_its_buffer_bound_gets_nothing_while_others_do(tmp_path: Path) -> None:
    bound = 1 * MIB
    doc = {"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 256 * 1024, "offloadBufferMaxBytes": bound}}
    buffers = str(tmp_path / "buffers.json")
    write_buffer_file(buffers, {A: figures(A, buffered_bytes=bound), B: figures(B, buffered_bytes=0), C: figures(C)}, 1)
    planner = ModelPlanner(
        options(bufferFile=buffers, policyVersionsFile=versions_file(tmp_path, doc)),
        {A: (1000, 4096), B: (1000, 4096), C: (1000, 4096)},
    )
    start = planner.initial_offset()
    end = planner.latest_offset(start, None, 64 * MIB)
    counts = admitted(start, end)
    assert counts[A] == 0
    # B and C get what fits their room (the bound: their buffers are empty), not the 32 MiB per-trigger share.
    assert counts[B] == counts[C] == bound // 4096

    # Once A's buffer drained below the bound, A is read again, at most its room (but one entry).
    write_buffer_file(buffers, {A: figures(A, buffered_bytes=bound - 3 * 4096)}, 1)
    end2 = planner.latest_offset(end, None, 64 * MIB)
    assert admitted(end, end2)[A] == 3
    write_buffer_file(buffers, {A: figures(A, buffered_bytes=bound - 10)}, 1)
    end3 = planner.latest_offset(end2, None, 64 * MIB)
    assert admitted(end2, end3)[A] == 1  # a room smaller than one entry still admits one


def test_the_buffer_bound_applies_without_other_limits_and_per_topic_policy(tmp_path: Path) -> None:
    doc = {
        "offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 65536, "offloadBufferMaxBytes": 1 * MIB},
        "topics": {B: {"offloadBufferMaxBytes": 2 * MIB}},
    }
    buffers = str(tmp_path / "buffers.json")
    planner = ModelPlanner(
        options(bufferFile=buffers, policyVersionsFile=versions_file(tmp_path, doc)),
        {A: (5000, 1024), B: (5000, 1024), C: (10, 1024)},
    )
    start = planner.initial_offset()  # no file yet: empty buffers, each topic-partition bounded by its policy
    counts = admitted(start, planner.latest_offset(start, None, None))
    assert counts == {A: 1024, B: 2048, C: 10}


def test_a_small_configured_bound_is_raised_to_what_the_segmenter_can_hold(tmp_path: Path) -> None:
    """bound = block size on S3 (5 MiB parts): complete blocks wait for a part, so the buffer can pass
    the configured bound between batches. Refusing the topic then would stall it until the rollover."""
    doc = {"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 65536, "offloadBufferMaxBytes": 65536}}
    buffers = str(tmp_path / "buffers.json")
    write_buffer_file(buffers, {A: figures(A, buffered_bytes=3 * 65536)}, 5 * MIB)
    planner = ModelPlanner(
        options(bufferFile=buffers, policyVersionsFile=versions_file(tmp_path, doc)), {A: (10_000, 1024)}
    )
    start = planner.initial_offset()
    counts = admitted(start, planner.latest_offset(start, None, 64 * MIB))
    assert counts[A] == (65536 + 5 * MIB - 3 * 65536) // 1024


@pytest.mark.parametrize(
    ("block", "bound", "min_part", "sizes"),
    [
        (4096, 4096, 1, [1000, 1000, 3000]),  # filesystem, bound = block: the 4096
        (65536, 65536, 256 * 1024, [5000, 700, 20_000]),  # S3-like parts bigger than the bound
        (65536, 200_000, 1, [60_000, 1024, 4096]),  # entries near the block size
        (1 * MIB, 4 * MIB, 5 * MIB, [130_000, 130_000, 4096]),
    ],
)
def test_closed_loop_with_the_real_segmenter_never_stalls_and_stays_within_the_bound(
    tmp_path: Path, block: int, bound: int, min_part: int, sizes: list[int]
) -> None:
    """Planner -> segmenter -> buffer file -> planner, until every entry is offloaded: every trigger
    admits something while entries remain (no deadlock, no topic starves), and what a topic-partition's
    segmenter holds after a batch never passes the bound plus one entry."""
    policy_doc = {
        "offload": {
            "managedLedgerOffloadMaxBlockSizeInBytes": block,
            "offloadBufferMaxBytes": bound,
            "maxSizePerOffloadSegmentMbytes": 64,
        }
    }
    policy = parse_config(small_messages(policy_doc)).policy_for(A)
    effective = buffer_bound(policy, min_part)
    topics = [A, B, C]
    model = {tp: (150, size) for tp, size in zip(topics, sizes, strict=True)}
    buffers = str(tmp_path / "buffers.json")
    planner = ModelPlanner(options(bufferFile=buffers, policyVersionsFile=versions_file(tmp_path, policy_doc)), model)
    states = {tp: MemoryState() for tp in topics}
    stats: dict[str, StatsAction] = {}
    offset = planner.initial_offset()
    budget = 3 * 256 * 1024  # a per-trigger bound smaller than the buffers, so both limits take turns
    for trigger in range(2000):
        if all(offset[tp][1] == model[tp][0] - 1 for tp in topics):
            break
        end = planner.latest_offset(offset, None, budget)
        counts = admitted(offset, end)
        assert sum(counts.values()) > 0, f"trigger {trigger}: nothing admitted with entries left: {offset}"
        for tp in topics:
            size = model[tp][1]
            before = stats[tp].buffered_bytes if tp in stats else 0
            assert before < effective  # between batches a buffer stays below the bound: never stuck
            # The batch's own bytes count against the room: before + batch <= bound + one entry.
            assert before + counts[tp] * size <= effective + size + 64 * counts[tp]
            entries = [
                Entry.of(LEDGER, e, b"x" * size, 1) for e in range(offset[tp][1] + 1, offset[tp][1] + 1 + counts[tp])
            ]
            actions = run_segmenter(tp, policy, states[tp], entries, now_ms=1000, min_part_size=min_part)
            last = actions[-1]
            assert isinstance(last, StatsAction)
            stats[tp] = last
        write_buffer_file(buffers, stats, min_part)
        planner.commit(end)
        offset = end
    else:
        pytest.fail("the backlog was not drained in 2000 triggers")
    assert all(offset[tp][1] == model[tp][0] - 1 for tp in topics)


def test_buffer_file_per_run_replaces_earlier_runs(tmp_path: Path) -> None:
    versions = str(tmp_path / "policy-versions.json")
    first, second = buffer_file_path(versions, 1), buffer_file_path(versions, 2)
    assert first != second and os.path.dirname(first) == str(tmp_path)
    write_buffer_file(first, {A: figures(A, buffered_bytes=10)}, 1)
    write_buffer_file(second, {A: figures(A, buffered_bytes=20, open_segment="x")}, 5 * MIB)
    assert not os.path.exists(first)
    assert BufferFile(second).current() == (5 * MIB, {A: 20})
    assert BufferFile(str(tmp_path / "missing.json")).current() == (1, {})
    (tmp_path / "bad.json").write_text("{not json")
    assert BufferFile(str(tmp_path / "bad.json")).current() == (1, {})


def test_bad_seal_at_end_names_the_option() -> None:
    with pytest.raises(Exception, match="sealAtEnd"):
        options(sealAtEnd="sometimes")


def test_a_fractional_mean_entry_size_leaves_no_entry_for_a_micro_batch_of_its_own(tmp_path: Path) -> None:
    """Measured: a 200 MB backlog over 4 topic-partitions took 2 micro-batches and then 4 more of one entry
    each: the byte share, divided back by a mean size like 131,072.7, rounded the last entry off."""
    buffers = str(tmp_path / "buffers.json")
    planner = ModelPlanner(options(bufferFile=buffers), {A: (300, 131_072), B: (301, 131_072), C: (299, 131_072)})
    start = planner.initial_offset()
    first = planner.latest_offset(start, None, 64 * MIB)
    stats = {tp: figures(tp, buffered_bytes=0, batch_entries=3, batch_bytes=3 * 131_072 + 2) for tp in (A, B, C)}
    write_buffer_file(buffers, stats, 1)
    os.utime(buffers, (1, 1))
    offsets = [start, first]
    while len(offsets) < 10:
        offsets.append(planner.latest_offset(offsets[-1], None, 64 * MIB))
        if offsets[-1] == offsets[-2]:
            break
    assert offsets[-2] == {A: [LEDGER, 299], B: [LEDGER, 300], C: [LEDGER, 298]}
    assert len(offsets) - 2 == 2  # 118 MiB in micro-batches of 64 MiB: 2, and no third of a single entry


def test_micro_batches_are_sized_by_the_measured_entry_size_not_one_sample(tmp_path: Path) -> None:
    """A producer's first batch is often small: sized by that one sampled entry, a 64 MiB micro-batch of
    entries 100 times larger would take 6 GiB. The job reports what each topic-partition's entries really
    weigh (the segmenter's batch figures, through the buffer file) and the planner sizes by that."""
    buffers = str(tmp_path / "buffers.json")
    planner = ModelPlanner(options(bufferFile=buffers, topics=A), {A: (100_000, 1024)})  # the probe says 1 KiB
    start = planner.initial_offset()
    after_first = planner.latest_offset(start, None, 10 * MIB)
    assert admitted(start, after_first)[A] == 10 * 1024  # 10 MiB of what the sample says

    # The segmenter saw those entries weigh 100 KiB on average.
    write_buffer_file(buffers, {A: figures(A, buffered_bytes=0, batch_entries=10, batch_bytes=10 * 100 * 1024)}, 1)
    os.utime(buffers, (1, 1))  # a new stamp even within the file system's time resolution
    end = planner.latest_offset(after_first, None, 10 * MIB)
    assert admitted(after_first, end)[A] == 102  # 10 MiB of 100 KiB entries
    assert json.loads(Path(buffers).read_text())["entry_bytes"] == {A: 100 * 1024}


# --- waking the segmenter's timers: the job runs no micro-batch without new data --------------------------


def test_a_micro_batch_is_planned_when_a_timer_is_due_and_not_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job turns Spark's no-data micro-batches off (each cost most of a JVM CPU second at every trigger), so
    the source plans a micro-batch with no entries (``WAKE_KEY`` moves) when the segmenter reported a timer due:
    before the run's first report (restored timers are unknown), at the reported time, and after
    ``WAKE_FALLBACK_S`` whatever was reported. Never while entries move: that micro-batch fires timers anyway."""
    clock = {"wall": 1_000_000.0, "mono": 500.0}
    monkeypatch.setattr(offset_planner.time, "time", lambda: clock["wall"])
    monkeypatch.setattr(offset_planner.time, "monotonic", lambda: clock["mono"])
    path = str(tmp_path / "buffers.json")
    model = {A: (5, 100), B: (0, 100)}
    planner = ModelPlanner(options(bufferFile=path), model)
    start = planner.initial_offset()

    # Before the run's first report: every trigger plans a micro-batch, moving or not.
    moved = planner.latest_offset(start, None, None)
    assert moved == {A: [LEDGER, 4], B: [-1, -1]}  # entries move: no wake key needed
    woken = planner.latest_offset(moved, None, None)
    assert woken == {**moved, WAKE_KEY: 1_000_000_000}
    assert list(woken)[-1] == WAKE_KEY  # canonical JSON text: topic-partitions first

    # The job reported a timer 3 s ahead: nothing is planned (the offset stays), until it is due, once.
    write_buffer_file(path, {A: figures(A, wake_ms=1_000_003_000), B: figures(B, wake_ms=None)}, 1)
    clock["wall"] += 1
    clock["mono"] += 1
    assert planner.latest_offset(woken, None, None) == woken
    clock["wall"] += 2
    clock["mono"] += 2
    due = planner.latest_offset(woken, None, None)
    assert due == {**moved, WAKE_KEY: 1_000_003_000}
    assert planner.latest_offset(due, None, None) == due  # that timer was woken for: not again

    # No timer pending: nothing, until the fallback interval has passed since the last micro-batch.
    write_buffer_file(path, {A: figures(A, wake_ms=None)}, 1)
    clock["wall"] += WAKE_FALLBACK_S - 1
    clock["mono"] += WAKE_FALLBACK_S - 1
    assert planner.latest_offset(due, None, None) == due
    clock["wall"] += 1
    clock["mono"] += 1
    assert planner.latest_offset(due, None, None)[WAKE_KEY] == 1_000_033_000

    # New entries: a micro-batch of them, carrying the last wake over (only positions changed).
    model[B] = (3, 100)
    assert planner.latest_offset(due, None, None) == {A: [LEDGER, 4], B: [LEDGER, 2], WAKE_KEY: 1_000_003_000}

    # The key is not a topic-partition: the ranges of a wake-only micro-batch are none.
    reader = PulsarStreamReader({"serviceUrl": "pulsar://127.0.0.1:6650", "topics": f"{A},{B}", "bufferFile": path})
    assert reader.partitions(woken, due) == []


def test_without_the_jobs_buffer_file_no_wake_key_is_ever_added() -> None:
    planner = ModelPlanner(options(), {A: (0, 100)})
    start = planner.initial_offset()
    for _ in range(3):
        assert WAKE_KEY not in planner.latest_offset(start, None, None)
