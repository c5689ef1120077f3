"""Creating the Spark session the job and tests use, with the settings streaming offload needs."""

from __future__ import annotations

import os
import sys
from typing import Any


def build_session(
    master: str = "local[2]",
    app_name: str = "streamoffload",
    work_dir: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the RocksDB state store (transformWithState needs it), few shuffle
    partitions (one key per topic-partition; the default 200 would mostly run empty tasks), and
    the Python data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    # Under spark-submit the JVM is already up with the master and resources the user chose.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master)
    builder = (
        builder.appName(app_name)
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "2g")
    )
    if work_dir:
        builder = builder.config("spark.sql.warehouse.dir", os.path.join(work_dir, "warehouse")).config(
            "spark.local.dir", os.path.join(work_dir, "local")
        )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _register_data_sources(session)
    return session


def _register_data_sources(session: Any) -> None:
    from streamoffload.streaming.control import ControlDataSource
    from streamoffload.streaming.source import PulsarDataSource

    session.dataSource.register(PulsarDataSource)
    session.dataSource.register(ControlDataSource)
