"""What one micro-batch's broker traffic for a topic-partition costs the broker, as the job ages.

Run from the repository root:

    .venv/bin/python bench/subscribe_cost.py             # 6 rounds of 200 reads, both ways
    .venv/bin/python bench/subscribe_cost.py --rounds 3  # shorter

Each micro-batch asks every topic-partition for its latest position and reads its new entries: two
subscriptions. The job's readers unsubscribe when they close and reuse their subscription names
(``streamoffload/pulsar/subscription_names.py``). This bench measures, side by side on two brokers of their own,
the broker CPU (from /proc) of one "ask and read the last entry" with the job's readers and with a fresh
name for every subscription (what the readers did before session 30), round after round, while the topic
grows by ``--entries`` entries per round. With fresh names pulsar-lite's cost per subscription grows with the
names it has seen (it keeps each one in its metadata); with reused names it stays flat.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402

from streamoffload.embedded_broker import EmbeddedBroker  # noqa: E402
from streamoffload.pulsar import raw_reader as rr  # noqa: E402
from streamoffload.pulsar.latest_positions import latest_positions_raw  # noqa: E402
from streamoffload.pulsar.subscription_names import NAMES  # noqa: E402

_HZ = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


@contextmanager
def fresh_names() -> Iterator[None]:
    """Every subscription under a name never used before (names are never given back)."""
    original = NAMES.give_back
    NAMES.give_back = lambda topic, name: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        NAMES.give_back = original  # type: ignore[method-assign]


def rounds(reuse: bool, n_rounds: int, reads: int, entries: int) -> list[tuple[int, int, float]]:
    """Per round: (entries in the topic, subscriptions made so far, broker CPU ms per ask-and-read)."""
    out = []
    with EmbeddedBroker() as broker:
        topic = "persistent://public/default/subscribe-cost-partition-0"
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        raw = rr.RawClient(broker.service_url)
        stored = subscriptions = 0
        try:
            for _ in range(n_rounds):
                for _i in range(entries):
                    producer.send_async(b"x" * 200, None)
                producer.flush()
                stored += entries
                before = cpu_s(broker.pid or 0)
                with fresh_names() if not reuse else _nothing():
                    for _r in range(reads):
                        last = latest_positions_raw(raw, [topic])[topic]
                        assert isinstance(last, tuple)
                        got = list(rr.read_range_raw(raw, topic, (last[0], last[1] - 1), last))
                        assert len(got) == 1
                subscriptions += 2 * reads
                out.append((stored, subscriptions, 1000 * (cpu_s(broker.pid or 0) - before) / reads))
        finally:
            client.close()
    return out


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default: %(default)s)")
    parser.add_argument("--reads", type=int, default=200, help="asks-and-reads per round (default: %(default)s)")
    parser.add_argument("--entries", type=int, default=5000, help="entries published per round (default: %(default)s)")
    args = parser.parse_args(argv)
    print(f"subscribe_cost: {args.rounds} rounds of {args.reads} asks-and-reads, +{args.entries} entries a round")
    reused = rounds(True, args.rounds, args.reads, args.entries)
    fresh = rounds(False, args.rounds, args.reads, args.entries)
    print(f"  {'entries':>8} {'subscriptions':>13} {'names reused':>13} {'fresh names':>12} {'fresh ÷ reused':>15}")
    for (stored, subs, ms_reused), (_s, _n, ms_fresh) in zip(reused, fresh, strict=True):
        # /proc counts CPU in clock ticks (10 ms): a short round can spend none that it sees.
        ratio = f"{ms_fresh / ms_reused:.2f}" if ms_reused > 0 else "-"
        print(f"  {stored:>8,} {subs:>13,} {ms_reused:>10.2f} ms {ms_fresh:>9.2f} ms {ratio:>15}")
    print("  (broker CPU per latest-position question plus read of one entry: two subscriptions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
