"""Issue 26's rate-limit figure: a 30 s run of the offload job at a 10 MB/s upload limit, over the run and in each
5 s window after the first, against the target (within ±10%).

Run from the repository root:

    .venv/bin/python bench/rate_limit.py                  # ~2 min: publish ~400 MB, offload 40 s of it, measure 30 s
    .venv/bin/python bench/rate_limit.py --rate-mb 5 --seconds 20

It starts the embedded pulsar-lite broker, publishes a backlog larger than the run can upload (64 KiB entries),
and runs the job continuously (``local[2]``, a filesystem store, blocks of 1 MiB so that a part is at most about
1 MiB) with ``offloadTotalUploadRateBytesPerSecond`` set. The sink's processes log every part's bytes when they
pass the limit (``STREAMOFFLOAD_RATE_TRACE``, ``streaming/governance/rate_limits.py``); the run is measured from the
first part on: the figure over ``--seconds`` and over each 5 s window after the first (the first holds the
query's start).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.logs import log_beside
from streamoffload.config import parse_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.streaming.governance.rate_limits import TRACE_ENV
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.session import build_session

WINDOW_S = 5.0


def read_trace(trace: Path, kind: str = "upload") -> list[tuple[float, int]]:
    out = []
    for path in trace.glob("*.log"):
        for line in path.read_text().splitlines():
            stamp, what, n = line.split()
            if what == kind:
                out.append((float(stamp), int(n)))
    return sorted(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate-mb", type=float, default=10.0, help="upload limit, MB/s (10^6 bytes)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured run length")
    parser.add_argument("--entry-kib", type=int, default=64)
    parser.add_argument(
        "--topics",
        type=int,
        default=8,
        help="topic-partitions; the job's total is split over Spark's tasks (2), so fewer than that cannot reach it",
    )
    args = parser.parse_args()
    rate = int(args.rate_mb * 1e6)
    backlog = int(rate * (args.seconds + 15) * 1.2)
    work = Path(tempfile.mkdtemp(prefix="rate-limit-"))
    trace = work / "trace"
    trace.mkdir()
    os.environ[TRACE_ENV] = str(trace)  # before Spark starts: its Python workers inherit it
    print(f"rate-limit bench: target {rate / 1e6:g} MB/s for {args.seconds:g} s; work {work}")
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
        config = parse_config(
            {
                "pulsar": {"service_url": broker.service_url, "topics": topics, "max_message_size": 2 * entry},
                "store": {"root": str(work / "store")},
                "spark": {"checkpoint": str(work / "checkpoint"), "trigger_interval": "1 second"},
                "metrics": {"address": ""},
                "offload": {
                    "managedLedgerOffloadMaxBlockSizeInBytes": max(1 << 20, 2 * entry + 4096),
                    "offloadTotalUploadRateBytesPerSecond": rate,
                },
            },
            "bench",
        )
        spark = build_session("local[2]", "rate-limit-bench")
        job = OffloadJob(config)
        thread = threading.Thread(target=job.run_forever, args=(spark,), daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + args.seconds + 240
            while time.monotonic() < deadline:
                parts = read_trace(trace)
                if parts and parts[-1][0] - parts[0][0] >= args.seconds + 1:
                    break
                time.sleep(1)
        finally:
            job.stop()
            thread.join(60)
            spark.stop()
    parts = read_trace(trace)
    if not parts:
        print("no part was uploaded")
        return 1
    t0 = parts[0][0]
    in_run = [(t - t0, n) for t, n in parts if t - t0 < args.seconds]
    total = sum(n for _, n in in_run)
    overall = total / args.seconds
    print(f"parts: {len(in_run)} in {args.seconds:g} s, largest {max(n for _, n in in_run)} bytes")
    ok = abs(overall / rate - 1) <= 0.10
    print(
        f"whole run: {overall / 1e6:.2f} MB/s vs target {rate / 1e6:g}"
        f" ({overall / rate - 1:+.1%}) {'OK' if ok else 'OUT'}"
    )
    windows = int(args.seconds // WINDOW_S)
    for w in range(windows):
        got = sum(n for t, n in in_run if w * WINDOW_S <= t < (w + 1) * WINDOW_S) / WINDOW_S
        within = abs(got / rate - 1) <= 0.10
        note = " (the first: the query's start)" if w == 0 else ""
        if w > 0:
            ok = ok and within
        print(
            f"window {w * WINDOW_S:4.0f}-{(w + 1) * WINDOW_S:3.0f} s:"
            f" {got / 1e6:6.2f} MB/s ({got / rate - 1:+.1%}){note}"
        )
    print("result: " + ("every figure within ±10% of the target" if ok else "OUTSIDE ±10%"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
