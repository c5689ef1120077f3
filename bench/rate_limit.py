"""Issues 26 and 50: the offload job's total upload or read limit vs its target, measured from the store's growth
(the bytes of its committed data objects, sampled every 0.05 s), over a 30 s window and each 5 s window in it.

Run from the repository root:

    .venv/bin/python bench/rate_limit.py                          # ~2 min: upload limit, 8 topic-partitions
    .venv/bin/python bench/rate_limit.py --topics 1 --once        # one busy topic-partition, run --once
    .venv/bin/python bench/rate_limit.py --kind read --rate-mb 4  # the read limit
    .venv/bin/python bench/rate_limit.py --rate-mb 5 --seconds 20

It starts the embedded pulsar-lite broker, publishes a backlog larger than the run can move (64 KiB entries), and
runs the job (``local[2]``, a filesystem store, 1 MiB blocks and 1 MiB segments, each written as one object)
continuously, or ``--once`` (``run --once``), with ``offloadTotal{Upload,Read}RateBytesPerSecond`` set. The
backlog is one micro-batch, so the sink's stage is one long upload at the limit. A read run keeps no spool: its
source reads the backlog (at the limit), then its sink reads it again from the broker (at the limit) as it
uploads, and its growth is counted in the committed segments' entry bytes (what the read limit counts; a data
object also holds its blocks' framing). The window starts once the store holds 5 s of the target (past the
query's start). ``tests/streaming/job/test_total_rate_limits.py`` is the suite's shorter version.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.logs import log_beside
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import parse_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import StreamOffloadError
from streamoffload.produce import produce
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.session import build_session

WINDOW_S = 5.0
POLL_S = 0.05
DATA_OBJECT = re.compile(r"(^|/)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
"""A segment's data object (``storage.keys.data_name``): its index, checksums and the metadata are not counted."""


class StoreGrowth:
    """When each of ``store``'s data objects first appeared (listed every ``POLL_S`` in a thread while in a
    ``with``), and so the store's growth over time: in the objects' bytes (what the upload limit counts), or in
    their segments' entry bytes (what the read limit counts; :meth:`entry_bytes`, from the committed segments)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.first_seen: dict[str, tuple[float, int]] = {}
        """Data object key -> (monotonic seconds when first listed, its size)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-growth", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for info in self.store.list(""):
                if info.key not in self.first_seen and DATA_OBJECT.search(info.key):
                    self.first_seen[info.key] = (time.monotonic(), info.size)
            self._stop.wait(POLL_S)

    def __enter__(self) -> StoreGrowth:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def entry_bytes(self, topics: list[str]) -> dict[str, int]:
        """Data object key -> its committed segment's entry bytes: an object's bytes are its entries' and the
        framing (block headers, padding to the block size: ~10% with 8 KiB entries in 64 KiB blocks)."""
        metadata = MetadataStore(ScopedStore(self.store))
        return {s.dataKey: s.entryBytes for topic in topics for s in metadata.offloaded_segments(topic)}

    def curve(self, sizes: Mapping[str, int] | None = None) -> list[tuple[float, int]]:
        """``(monotonic seconds, bytes)`` after each object appeared: their sizes, or ``sizes``'."""
        out, total = [], 0
        for at, key in sorted((at, key) for key, (at, _size) in list(self.first_seen.items())):
            total += self.first_seen[key][1] if sizes is None else sizes.get(key, 0)  # 0: not committed
            out.append((at, total))
        return out

    def first_at(self, size: int, sizes: Mapping[str, int] | None = None) -> tuple[float, int] | None:
        """When the store first held at least ``size`` bytes, and how many."""
        return next((point for point in self.curve(sizes) if point[1] >= size), None)

    def rate(self, start: int, end: int, sizes: Mapping[str, int] | None = None) -> float:
        """Bytes per second from when the store first held ``start`` bytes to when it first held ``end``."""
        a, b = self.first_at(start, sizes), self.first_at(end, sizes)
        if a is None or b is None:
            raise AssertionError(f"the store never held {start} and {end} bytes: {self.curve(sizes)[-1:]}")
        return (b[1] - a[1]) / (b[0] - a[0])

    def between(self, t0: float, t1: float, sizes: Mapping[str, int] | None = None) -> float:
        """Bytes per second that appeared from ``t0`` to ``t1``."""
        curve = self.curve(sizes)
        at = [b for t, b in curve if t <= t0]
        upto = [b for t, b in curve if t <= t1]
        return ((upto[-1] if upto else 0) - (at[-1] if at else 0)) / (t1 - t0)


def run_job(job: OffloadJob, spark: Any, once: bool) -> None:
    """The job until the bench stops it (a ``run --once`` stopped early says so: not this bench's failure)."""
    try:
        if once:
            job.run_once(spark)
        else:
            job.run_forever(spark)
    except StreamOffloadError as err:
        print(f"the job: {err}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("upload", "read"), default="upload", help="which total limit")
    parser.add_argument("--rate-mb", type=float, default=10.0, help="the limit, MB/s (10^6 bytes)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--entry-kib", type=int, default=64)
    parser.add_argument("--topics", type=int, default=8, help="busy topic-partitions")
    parser.add_argument("--once", action="store_true", help="run --once over the backlog, not continuously")
    args = parser.parse_args()
    rate = int(args.rate_mb * 1e6)
    lead = int(rate * WINDOW_S)  # the window starts here: past the query's start
    backlog = lead + int(rate * (args.seconds + 6))
    work = Path(tempfile.mkdtemp(prefix="rate-limit-"))
    mode = "run --once" if args.once else "continuous"
    print(
        f"rate-limit bench: total {args.kind} limit {rate / 1e6:g} MB/s, {args.topics} topic-partition(s), {mode},"
        f" {args.seconds:g} s measured; work {work}"
    )
    log_beside(work)
    with EmbeddedBroker(work / "broker") as broker:
        topics = [f"persistent://public/default/rate-bench-{i}" for i in range(args.topics)]
        entry = args.entry_kib * 1024
        count = backlog // entry // len(topics) + 1
        started = time.monotonic()
        produce(broker.service_url, topics, count=count, payload_size=entry, batching=False)
        count *= len(topics)
        print(
            f"published {count} entries of {entry} bytes ({count * entry / 1e6:.0f} MB)"
            f" in {time.monotonic() - started:.0f} s"
        )
        key = "offloadTotalReadRateBytesPerSecond" if args.kind == "read" else "offloadTotalUploadRateBytesPerSecond"
        pulsar: dict[str, object] = {"service_url": broker.service_url, "topics": topics, "max_message_size": 2 * entry}
        config = parse_config(
            {
                "pulsar": pulsar,
                "store": {"root": str(work / "store")},
                # A read run keeps no spool: the sink reads the entries again as it uploads them (under the limit).
                "spark": {
                    "checkpoint": str(work / "checkpoint"),
                    "trigger_interval": "1 second",
                    "spool": args.kind != "read",
                },
                "metrics": {"address": ""},
                "offload": {
                    "managedLedgerOffloadMaxBlockSizeInBytes": max(1 << 20, 2 * entry + 4096),
                    "maxSizePerOffloadSegmentMbytes": 1,
                    "maxOffloadSegmentRolloverTimeMinutes": 10,
                    key: rate,
                },
            },
            "bench",
        )
        spark = build_session("local[2]", "rate-limit-bench")
        job = OffloadJob(config)
        end = lead + int(rate * args.seconds)
        with StoreGrowth(config.store.location.open().store) as growth:
            thread = threading.Thread(target=run_job, args=(job, spark, args.once), daemon=True)
            thread.start()
            try:
                deadline = time.monotonic() + args.seconds + 240
                while time.monotonic() < deadline and growth.first_at(end) is None and thread.is_alive():
                    time.sleep(0.5)
            finally:
                job.stop()
                thread.join(120)
                spark.stop()
    sizes = growth.entry_bytes(topics) if args.kind == "read" else None  # what the read limit counts
    first, last = growth.first_at(lead, sizes), growth.first_at(end, sizes)
    if first is None or last is None:
        print(f"the store never held {end} bytes: {growth.curve(sizes)[-1:]}")
        return 1
    overall = growth.rate(lead, end, sizes)
    ok = abs(overall / rate - 1) <= 0.10
    what = "entry bytes of committed segments" if sizes is not None else "bytes of data objects"
    print(
        f"{(last[1] - first[1]) / 1e6:.0f} MB ({what}) in {last[0] - first[0]:.1f} s: {overall / 1e6:.2f} MB/s vs"
        f" target {rate / 1e6:g} ({overall / rate - 1:+.1%}) {'OK' if ok else 'OUT'}"
    )
    t0 = first[0]
    for w in range(int((last[0] - t0) // WINDOW_S)):
        got = growth.between(t0 + w * WINDOW_S, t0 + (w + 1) * WINDOW_S, sizes)
        print(f"window {w * WINDOW_S:4.0f}-{(w + 1) * WINDOW_S:3.0f} s: {got / 1e6:6.2f} MB/s ({got / rate - 1:+.1%})")
    print("result: " + ("within ±10% of the target" if ok else "OUTSIDE ±10%"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
