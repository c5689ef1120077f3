"""``read.dataset_read.read_tasks``: many tasks read as ``read_task`` reads each of them, small ones decoded as one
run. The same record batches, cut at the same rows and handed to the same task, as ``read_task`` over each task in
turn; and where something fails or the fast path declines part way, the same batches before the same error."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.dataframe.synthetic import build_topic

BASE = "persistent://public/default/orders"
P0, P1 = f"{BASE}-partition-0", f"{BASE}-partition-1"
AUDIT = "persistent://public/default/audit"

Read = list[tuple[int, pa.RecordBatch]]


def one_by_one(scoped: ScopedStore, tasks: list[ofp.ReadTask], **kwargs: int) -> tuple[Read, str | None]:
    """``read_task`` over each task in turn: its batches, and the error that ended the read (None)."""
    out: Read = []
    try:
        for i, task in enumerate(tasks):
            out += [(i, batch) for batch in ofr.read_task(scoped, task, **kwargs)]
    except Exception as exc:
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


def together(scoped: ScopedStore, tasks: list[ofp.ReadTask], **kwargs: int) -> tuple[Read, str | None]:
    out: Read = []
    try:
        for i, batch in ofr.read_tasks(scoped, tasks, **kwargs):
            out.append((i, batch))
    except Exception as exc:
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


def assert_same(expected: tuple[Read, str | None], got: tuple[Read, str | None]) -> None:
    assert [i for i, _ in got[0]] == [i for i, _ in expected[0]]
    assert [b.num_rows for _, b in got[0]] == [b.num_rows for _, b in expected[0]]
    for (_, want), (_, have) in zip(expected[0], got[0], strict=True):
        assert have.schema == want.schema
        assert have.equals(want)
    assert got[1] == expected[1]


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> ScopedStore:
    store = ScopedStore(FilesystemStore(str(tmp_path_factory.mktemp("tasks"))))
    # many small segments of batches of 4 across two ledgers; fewer of single messages; a topic of one segment
    build_topic(store, P0, entries=600, batch=4, entries_per_ledger=250, segment_bytes=16 * 1024, seed=1)
    build_topic(store, P1, entries=300, batch=1, segment_bytes=8 * 1024, seed=2)
    build_topic(store, AUDIT, entries=40, batch=3, seed=3)
    return store


def tasks_of(scoped: ScopedStore, *topics: str) -> list[ofp.ReadTask]:
    return ofp.plan(scoped, list(topics), {})


def test_the_batches_of_read_task_for_every_task_in_turn(scoped: ScopedStore) -> None:
    tasks = tasks_of(scoped, P0, P1, AUDIT)
    assert len({t.topic for t in tasks}) == 3 and len(tasks) > 20
    expected = one_by_one(scoped, tasks)
    assert sum(b.num_rows for _, b in expected[0]) == 600 * 4 + 300 + 40 * 3
    assert_same(expected, together(scoped, tasks))


@pytest.mark.parametrize(
    ("batch_rows", "batch_bytes"),
    [(7, 1 << 20), (64, 1 << 20), (1 << 14, 3000), (1 << 14, 1 << 12)],
    ids=["few-rows", "some-rows", "few-bytes", "tasks-streamed"],
)
def test_cut_at_the_same_rows_whatever_the_bounds(scoped: ScopedStore, batch_rows: int, batch_bytes: int) -> None:
    tasks = tasks_of(scoped, P0, P1)
    kwargs = {"batch_rows": batch_rows, "batch_bytes": batch_bytes}
    expected = one_by_one(scoped, tasks, **kwargs)
    assert len(expected[0]) > len(tasks)  # several batches in some task
    assert_same(expected, together(scoped, tasks, **kwargs))


def test_small_tasks_of_one_topic_are_planned_as_runs_up_to_run_bytes(scoped: ScopedStore) -> None:
    tasks = tasks_of(scoped, P0, P1, AUDIT)
    sizes = [t.data_bytes for t in tasks]
    assert all(0 < size < 20_000 for size in sizes)
    runs = ofr._runs(tasks, 40_000, 1 << 20)
    assert [i for _, run in runs for i in run] == list(range(len(tasks)))  # every task once, in order
    assert not any(streamed for streamed, _ in runs)
    for _, run in runs:
        assert len({tasks[i].topic for i in run}) == 1
        assert sum(sizes[i] for i in run) <= 40_000 or len(run) == 1
    assert max(len(run) for _, run in runs) >= 2
    # a run ends where the next task would take it past run_bytes
    for (_, run), (_, after) in itertools.pairwise(runs):
        if tasks[run[0]].topic == tasks[after[0]].topic:
            assert sum(sizes[i] for i in run) + sizes[after[0]] > 40_000
    # a task at least batch_bytes, or of unknown size, is streamed alone
    unknown = dataclasses.replace(tasks[1], data_bytes=0)
    planned = ofr._runs([tasks[0], unknown, tasks[2]], 1 << 20, 1 << 20)
    assert planned == [(False, [0]), (True, [1]), (False, [2])]
    assert ofr._runs(tasks[:2], 1 << 20, sizes[1]) == [(False, [0]), (True, [1])]


def test_position_bounds_inside_a_segment(scoped: ScopedStore) -> None:
    [first, *_] = MetadataStore(scoped).offloaded_segments(P0)
    bounds = ofp.PositionBounds((first.startLedgerId, first.startEntryId + 5), (3, 400))
    tasks = ofp.plan(scoped, [P0], {P0: bounds})
    expected = one_by_one(scoped, tasks)
    assert expected[0][0][1].column("__entryId")[0].as_py() == first.startEntryId + 5
    assert_same(expected, together(scoped, tasks))


def test_an_entry_the_fast_path_declines_reads_one_by_one_with_the_same_error(tmp_path: Path) -> None:
    store = ScopedStore(FilesystemStore(str(tmp_path)))
    topic = "persistent://public/default/secret"
    build_topic(store, topic, entries=200, batch=2, segment_bytes=4096, encrypted=frozenset({150}))
    tasks = tasks_of(store, topic)
    expected = one_by_one(store, tasks)
    assert expected[0] and expected[1] is not None and "entry 3:150 of" in expected[1]
    assert "end-to-end encrypted" in expected[1]
    assert_same(expected, together(store, tasks))


def test_a_corrupt_segment_gives_the_rows_before_it_then_its_error(tmp_path: Path) -> None:
    store = ScopedStore(FilesystemStore(str(tmp_path)))
    topic = "persistent://public/default/corrupt"
    build_topic(store, topic, entries=300, batch=4, segment_bytes=8 * 1024)
    segments = MetadataStore(store).offloaded_segments(topic)
    assert len(segments) > 4
    path = tmp_path / segments[3].dataKey
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    tasks = tasks_of(store, topic)
    expected = one_by_one(store, tasks)
    assert expected[1] is not None and segments[3].dataKey in expected[1]
    assert {0, 1, 2} <= {i for i, _ in expected[0]} <= {0, 1, 2, 3}  # the segments before it, and its own start
    assert_same(expected, together(store, tasks))
