"""The offload job on Spark Structured Streaming, in rooms (docs/DESIGN.md "Layers"): ``job/`` over the
stages ``source/``, ``segmenter/`` and ``sink/`` (which never import each other), over what they share
(``control/``, ``handoff/``), over Spark's process plumbing (``runtime/``); the Pulsar protocol client
(``streamoffload.pulsar``, no Spark) is below them all. Spark code is kept thin over plain Python that tests
can call without Spark.
This module holds only :func:`register`."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


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
    from streamoffload.streaming.source.pulsar_source import OwnNamePulsarDataSource, PulsarDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(OwnNamePulsarDataSource)
    register_unless_taken(spark, PulsarDataSource)
    spark.dataSource.register(ControlDataSource)
    spark.dataSource.register(OffloadedDataSource)


def register_unless_taken(spark: Any, source: Any) -> bool:
    """Register a Python data source unless a built-in or JVM source has its name (Spark refuses it with
    ``DATA_SOURCE_ALREADY_EXISTS``); returns whether it was registered."""
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(source)
    except AnalysisException as err:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(err):
            raise
        log.warning(
            "data source %r is a JVM source on the classpath (pulsar-spark's jar?): format(%r) reads with it; "
            "streamoffload's live source is format('streamoffload-pulsar')",
            source.name(),
            source.name(),
        )
        return False
    return True


__all__ = ["register", "register_unless_taken"]
