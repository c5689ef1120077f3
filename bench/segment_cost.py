"""What one small segment costs the job, apart from Spark and the broker: the segmenter's decisions and the sink's
store writes for segments of ``--entries`` entries of ``--entry-size`` bytes, on a filesystem store without its
fsyncs, with an fsync per file (``sync="file"``) and with its default group commit (``sync="group"``: one
``syncfs`` per barrier, shared by the threads waiting at once; one thread here) (bench/README, issue 24 sessions 26
and 39).

Run from the repository root:

    .venv/bin/python bench/segment_cost.py                    # 200 segments of 100 entries of 200 B
    .venv/bin/python bench/segment_cost.py --segments 500 --entries 20 --dir /tmp

A job over N topic-partitions with a rollover of R seconds seals about N / R segments a second (the scale bench:
100 / 5 s = 20). Each segment here is one micro-batch of its entries (``run_segmenter``) and one seal request,
applied by the job's sink (``SegmentSink``) reading the entries' bytes from memory, so what is timed is the
segmenter, the sink and the store. Such a segment (opened and sealed in one micro-batch, in the clear, at most
``WHOLE_SEGMENT_BYTES``) is written whole: its checksum records, the data object in one PUT, then the seal (index,
lease check, commit, Offloaded manifest). Beside it, the same segments through the multipart path every larger or
longer-lived segment takes (open: multipart upload and Assigned manifest; a part with its checksum records; seal:
complete, index, lease check, commit, Offloaded manifest). Printed per segment: wall and CPU milliseconds (this
process, so a filesystem's fsync counts what the kernel spends in it), fsyncs and syncfs calls, and store requests
by operation, each round in each way of syncing; the median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.entries import Published, memory_sink, publish_to
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.entry_fetch import MemoryFetcher

TOPIC = "persistent://public/default/segment-cost"
OPERATIONS = ("put", "get", "head", "list", "delete", "start_multipart", "resume_multipart")
"""Counted as called (``exists`` is a ``head``, counted once as that; a multipart upload's parts and complete are
its own object's, not counted)."""


class CountingFilesystemStore(FilesystemStore):
    """A filesystem store that counts its requests by operation."""

    def __init__(self, root: str, *, fsync: bool, sync: str) -> None:
        super().__init__(root, fsync=fsync, sync=sync)
        self.requests: collections.Counter[str] = collections.Counter()

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in OPERATIONS:
            requests = super().__getattribute__("requests")

            def counted(*args: Any, **kwargs: Any) -> Any:
                requests[name] += 1
                return attribute(*args, **kwargs)

            return counted
        if name == "put_many":  # a PUT each (on S3 at once)
            requests = super().__getattribute__("requests")

            def counted_many(objects: Any) -> Any:
                requests["put"] += len(objects)
                return attribute(objects)

            return counted_many
        return attribute


def one_round(
    directory: str, segments: int, entries: int, entry_size: int, *, sync: str, whole: bool
) -> dict[str, Any]:
    """Offload ``segments`` segments into a new store (``sync``: ``off``, or the store's ``file`` or ``group``);
    per segment: wall ms, CPU ms, fsyncs, syncfs calls, requests."""
    fsyncs = [0]
    real_fsync = os.fsync

    def counting_fsync(fd: FileDescriptorLike) -> None:
        fsyncs[0] += 1
        real_fsync(fd)

    root = tempfile.mkdtemp(dir=directory, prefix="segment-cost-")
    store = CountingFilesystemStore(root, fsync=sync != "off", sync="file" if sync == "off" else sync)
    syncer = store._syncer()
    rounds_before = getattr(syncer, "rounds", 0)
    fetcher = MemoryFetcher()
    sink = memory_sink(ScopedStore(store), fetcher=fetcher)
    if not whole:
        sink.whole_segment_bytes = 0
    policy = OffloadPolicy()
    state = MemoryState()
    now_ms = int(time.time() * 1000)
    payload = os.urandom(entry_size)
    os.fsync = counting_fsync  # the store's fsyncs (storage/fs_sync.py calls os.fsync)
    try:
        wall = cpu = 0.0
        for segment in range(segments):
            batch = [Published(1, segment * entries + i, payload, now_ms) for i in range(entries)]
            fetcher.entries.clear()  # the broker's part: this segment's entries only (a scan of all is not the job's)
            metas = publish_to(fetcher, TOPIC, batch)
            started, started_cpu = time.perf_counter(), time.process_time()
            actions = run_segmenter(TOPIC, policy, state, metas, now_ms=now_ms)
            actions += run_segmenter(TOPIC, policy, state, [], [CONTROL_SEAL], now_ms=now_ms + 1)
            sink.apply(actions)
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
    finally:
        os.fsync = real_fsync
    sealed = sum(1 for _ in sink.metadata.offloaded_segments(TOPIC))
    if sealed != segments:
        raise SystemExit(f"expected {segments} segments offloaded, found {sealed}")
    return {
        "wall_ms": 1000 * wall / segments,
        "cpu_ms": 1000 * cpu / segments,
        "fsyncs": fsyncs[0] / segments,
        "syncfs": (getattr(syncer, "rounds", 0) - rounds_before) / segments,
        "requests": {op: n / segments for op, n in sorted(store.requests.items())},
    }


SYNC_LABELS = {"group": "group commit  ", "file": "fsync per file", "off": "without syncs "}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench/segment_cost.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--segments", type=int, default=200, help="segments per round (default 200)")
    parser.add_argument("--entries", type=int, default=100, help="entries per segment (default 100)")
    parser.add_argument("--entry-size", type=int, default=200, help="bytes per entry (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the median is printed (default 3)")
    parser.add_argument("--dir", default="var", help="where the stores go (default var/, as the demo's store)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(
        f"segment cost: {args.segments} segments of {args.entries} entries of {args.entry_size} B per round, "
        f"filesystem store under {args.dir}, median of {args.rounds}"
    )
    for whole in (True, False):
        for sync in ("group", "file", "off"):
            rounds = [
                one_round(args.dir, args.segments, args.entries, args.entry_size, sync=sync, whole=whole)
                for _ in range(args.rounds)
            ]
            wall = statistics.median(r["wall_ms"] for r in rounds)
            cpu = statistics.median(r["cpu_ms"] for r in rounds)
            path = "written whole" if whole else "multipart    "
            print(
                f"  {path}  {SYNC_LABELS[sync]}  "
                f"{wall:6.1f} ms wall, {cpu:5.1f} ms CPU per segment ({1000 * cpu / args.entries:.0f} us per entry); "
                f"{rounds[0]['fsyncs']:.1f} fsyncs, {rounds[0]['syncfs']:.1f} syncfs; requests "
                + ", ".join(f"{op} {n:g}" for op, n in rounds[0]["requests"].items())
            )
    print("  (a job sealing S segments a second spends S times the CPU figure per second on them)")


if __name__ == "__main__":
    main()
