"""The offload job against Apache Pulsar: exact across Pulsar's own ledger rollovers and a broker restart, topics
found through ``GetTopicsOfNamespace``, entries stored with the ``0x0e01`` checksum the broker keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.entry import MAGIC_CRC32C, decode_entry
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.pulsar_standalone import PulsarStandalone
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.job import write_job_config
from tests.fixtures.pulsar import ROLLOVER_ENTRIES
from tests.fixtures.readback import read_entries, read_messages
from tests.pulsar.standalone.broker_truth import create_partitioned, held_messages, internal_ledgers, new_namespace

pytestmark = [pytest.mark.pulsar, pytest.mark.spark]


def write_config(tmp_path: Path, service_url: str, pulsar_keys: str) -> Path:
    """The tier's job configuration: entries of up to 16 KiB in 32 KiB blocks, segments sealed at 50 KB."""
    return write_job_config(
        tmp_path, service_url, pulsar=pulsar_keys, max_message_size=16384, block_bytes=32768, segment_mb=0.05
    )


def test_job_is_exact_across_pulsar_rollovers_a_restart_and_a_listed_pattern(
    spark: Any, apache_pulsar: PulsarStandalone, tmp_path: Path
) -> None:
    namespace = new_namespace(apache_pulsar, "job")
    plain = f"persistent://{namespace}/plain"
    parted = f"persistent://{namespace}/parted"
    other = f"persistent://{namespace}/other"
    create_partitioned(apache_pulsar, parted, 2)
    url = apache_pulsar.service_url
    produce(url, plain, 2 * ROLLOVER_ENTRIES + 20, 300, keys=3, batching=False)
    produce(url, parted, 1400, 60, partitions=2, keys=5, batching=True, batch_size=10, batch_delay_ms=50)
    produce(url, other, 10, 50, batching=False)
    parts = [f"{parted}-partition-{i}" for i in range(2)]

    # topicsPattern, resolved by the broker's GetTopicsOfNamespace: no topicsPatternCandidates.
    config_path = write_config(tmp_path, url, f'topics_pattern = "persistent://{namespace}/(plain|parted)"')
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    scoped = config.store.location.open()
    meta = MetadataStore(scoped)
    assert meta.manifests(other) == []
    for tp in [plain, *parts]:
        assert len(internal_ledgers(apache_pulsar, tp)) >= 2, f"{tp} should span Pulsar ledger rollovers"
        assert read_messages(scoped, tp) == held_messages(apache_pulsar, tp), tp

    # A restart closes the open ledger; what comes after is in a new one. The job continues exactly.
    before = internal_ledgers(apache_pulsar, plain)
    apache_pulsar.restart()
    produce(url, plain, 30, 300, keys=3, batching=False)
    produce(url, parted, 200, 60, partitions=2, keys=5, batching=True, batch_size=10, batch_delay_ms=50)
    after = internal_ledgers(apache_pulsar, plain)
    assert after[: len(before)] == before and len(after) > len(before)
    OffloadJob(config, str(config_path)).run_once(spark)
    for tp in [plain, *parts]:
        assert read_messages(scoped, tp) == held_messages(apache_pulsar, tp), tp
        assert all(m.status == mf.OFFLOADED for m in meta.manifests(tp))
        # Entries are stored as Apache Pulsar holds them: with the producer's 0x0e01 CRC-32C section, which
        # decodes (and so checks) here; pulsar-lite hands entries out without it.
        for ledger, entry, stored in read_entries(scoped, tp):
            assert int.from_bytes(stored[:2], "big") == MAGIC_CRC32C, (tp, ledger, entry)
            assert decode_entry(stored).checksum == int.from_bytes(stored[2:6], "big")
    assert {m.ledger_id for m in held_messages(apache_pulsar, plain)} == set(after)
