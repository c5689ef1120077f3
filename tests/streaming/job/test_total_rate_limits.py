"""Issue 50: the job's total upload and read limits hold, with one busy topic-partition as with eight, measured from
the store's growth (the bytes of its committed data objects, polled), not from the job's own counters.

Each limit in ``run --once`` and in a continuous run, over a window of ``WINDOW_S`` (the 30 s figure is
``bench/rate_limit.py``'s): from the time the store first holds ``LEAD`` bytes to the time it first holds
``LEAD + RATE x WINDOW_S``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.rate_limit import StoreGrowth
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import partition_names, unique_topic
from tests.fixtures.job import poll, write_job_config

pytestmark = [pytest.mark.spark, pytest.mark.broker]

KIB, MIB = 1 << 10, 1 << 20
ENTRY = 8 * KIB
RATE = 3 * MIB
WINDOW_S = 5.0
LEAD = 2 * MIB
SEGMENT = 256 * KIB
"""The window starts once the store holds this much: past the query's start and the sink's first parts."""


def limited_config(tmp_path: Path, service_url: str, topics: list[str], kind: str) -> Path:
    """The job over ``topics`` with a total ``kind`` limit of ``RATE``, and small segments (256 KiB, each written
    as one object, so that the store grows smoothly). A read run keeps no spool: the sink reads the entries again
    from the broker, under the same limit, as it uploads them."""
    path = write_job_config(
        tmp_path,
        service_url,
        topics=topics,
        max_message_size=16 * KIB,
        block_bytes=64 * KIB,
        segment_mb=SEGMENT / MIB,
    )
    text = path.read_text() + f'offloadTotal{kind.capitalize()}RateBytesPerSecond = "{RATE // MIB}MiB"\n'
    if kind == "read":
        text = text.replace('trigger_interval = "1 second"\n', 'trigger_interval = "1 second"\nspool = false\n')
    path.write_text(text)
    return path


def backlog(service_url: str, topics: list[str], total: int) -> int:
    """Publish at least ``total`` bytes of ``ENTRY``-sized entries to each of ``topics`` in turn; the entries of
    each topic-partition."""
    count = -(-total // ENTRY // len(topics))
    produce(service_url, topics, count=count, payload_size=ENTRY, batching=False)
    return count


@pytest.fixture
def store_growth() -> Iterator[Callable[[Path], StoreGrowth]]:
    """Sample a job's store (its configuration's) from now to the test's end."""
    growths: list[StoreGrowth] = []

    def start(config_path: Path) -> StoreGrowth:
        growth = StoreGrowth(load_config(config_path).store.location.open().store)
        growths.append(growth.__enter__())
        return growth

    yield start
    for growth in growths:
        growth.__exit__()


@pytest.mark.parametrize(
    ("kind", "topic_partitions", "mode"),
    [("upload", 1, "once"), ("upload", 8, "continuous"), ("read", 1, "continuous"), ("read", 8, "once")],
)
def test_a_total_limit_holds_whichever_topic_partitions_are_busy(
    spark: Any,
    running_job: Callable[[Path], OffloadJob],
    pulsar_broker: Any,
    tmp_path: Path,
    store_growth: Callable[[Path], StoreGrowth],
    kind: str,
    topic_partitions: int,
    mode: str,
) -> None:
    """The whole backlog is one micro-batch (``run --once``, or the continuous run's first): the sink's stage
    uploads it (and in a read run reads it again) at the limit, which the store's growth shows."""
    base = unique_topic(f"total-{kind}")
    topics = [base] if topic_partitions == 1 else partition_names(base, topic_partitions)
    end = LEAD + int(RATE * WINDOW_S)
    # Past the window's end by a margin and each topic-partition's open segment (sealed only at the run's end).
    entries = backlog(pulsar_broker.service_url, topics, end + 2 * MIB + len(topics) * SEGMENT)
    config_path = limited_config(tmp_path, pulsar_broker.service_url, topics, kind)
    growth = store_growth(config_path)

    def sizes() -> dict[str, int] | None:
        """The read limit counts entry bytes: the committed segments' (an object also holds its blocks'
        framing, ~10% here). The upload limit counts the objects' bytes."""
        return growth.entry_bytes(topics) if kind == "read" else None

    if mode == "once":
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
        metadata = MetadataStore(ScopedStore(growth.store))  # all of it, once
        offloaded = {topic: sum(s.entries for s in metadata.offloaded_segments(topic)) for topic in topics}
        assert offloaded == dict.fromkeys(topics, entries)
    else:
        running_job(config_path)
        poll(lambda: growth.first_at(end, sizes()), 120, f"{end} bytes offloaded")
    rate = growth.rate(LEAD, end, sizes())
    assert 0.9 * RATE <= rate <= 1.1 * RATE, (rate / MIB, growth.curve(sizes()))
