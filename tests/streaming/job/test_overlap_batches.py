"""Overlap is on by default where every task runs on this machine, and the micro-batches keep the configured
``maxBytesPerTrigger`` either way: smaller ones cost pulsar-lite more per byte than the overlap gives back (a calm
2 GB run: 128 MiB micro-batches with overlap 0.42 of overlap off, 1 GiB 1.27; bench/README.md "offload")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload.config import DEFAULT_MAX_BYTES_PER_TRIGGER, parse_config
from streamoffload.streaming.job.offload_job import OffloadJob


def job(tmp_path: Path, spark: dict[str, Any], pulsar: dict[str, Any] | None = None) -> OffloadJob:
    doc = {
        "pulsar": {"service_url": "pulsar://127.0.0.1:1", "topics": ["persistent://t/n/a"], **(pulsar or {})},
        "store": {"root": str(tmp_path / "store")},
        "spark": {"checkpoint": str(tmp_path / "checkpoint"), **spark},
    }
    return OffloadJob(parse_config(doc, "<test>"))


@pytest.mark.parametrize(
    ("spark", "pulsar", "overlapping", "expected"),
    [
        ({}, None, True, DEFAULT_MAX_BYTES_PER_TRIGGER),
        ({"master": "local-cluster[2,1,1024]"}, None, True, DEFAULT_MAX_BYTES_PER_TRIGGER),
        ({"overlap_writes": False}, None, False, DEFAULT_MAX_BYTES_PER_TRIGGER),
        ({"master": "spark://127.0.0.1:7077"}, None, False, DEFAULT_MAX_BYTES_PER_TRIGGER),
        ({}, {"max_bytes_per_trigger": 3 << 30}, True, 3 << 30),
    ],
)
def test_the_micro_batch_bound_with_and_without_overlap(
    tmp_path: Path, spark: dict[str, Any], pulsar: dict[str, Any] | None, overlapping: bool, expected: int
) -> None:
    offload = job(tmp_path, spark, pulsar)
    assert offload.overlapping() == overlapping
    assert int(offload.source_options()["maxBytesPerTrigger"]) == expected
