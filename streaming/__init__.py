"""The offload job on Spark Structured Streaming, in rooms (docs/DESIGN.md "Layers"): ``job/`` over the
stages ``source/``, ``segmenter/`` and ``sink/`` (which never import each other), over what they share
(``control/``, ``handoff/``), over Spark's process plumbing (``runtime/``); the Pulsar protocol client
(``streamoffload.pulsar``, no Spark) is below them all. Spark code is kept thin over plain Python that tests
can call without Spark.
This module holds only :func:`register`."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register streamoffload's Python data sources with a SparkSession: the live source as ``pulsar``
    (pulsar-spark's name) and ``streamoffload-pulsar`` (ours, which no JVM source has), the offload job's
    control source and the ``pulsar-offloaded`` batch source. Where a JVM source named ``pulsar`` is on the
    classpath (pulsar-spark's jar), Spark refuses a Python source of that name (SPARK-46522): ``pulsar`` is
    then pulsar-spark's, with one warning, and ours is ``streamoffload-pulsar``. Also turns on Python data
    source filter pushdown (``spark.sql.python.filterPushdown.enabled``; PySpark >= 4.1), which the batch
    source uses to prune by publish time, topic and position: with it off, Spark refuses a source that
    implements ``pushFilters``."""
    from streamoffload.streaming.source.control_source import ControlDataSource
    from streamoffload.streaming.source.offloaded_source import OffloadedDataSource
    from streamoffload.streaming.source.pulsar_source import (
        OwnNamePulsarDataSource,
        PulsarDataSource,
        register_unless_taken,
    )

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(OwnNamePulsarDataSource)
    register_unless_taken(spark, PulsarDataSource)
    spark.dataSource.register(ControlDataSource)
    spark.dataSource.register(OffloadedDataSource)


__all__ = ["register"]
