"""Spark's Python worker daemon, with the modules every task needs imported once, before it forks.

Spark starts Python workers by forking them from one daemon process per executor (``pyspark.daemon``).
The stock daemon imports little, so each new worker imports pandas, pyarrow, pyspark.sql and the job's
modules itself: about a CPU second per worker here, paid again whenever Spark starts a worker (a new
query, more concurrent tasks, a worker that died). ``bench/offload.py``'s process census and py-spy put
these imports at most of the Python workers' CPU. This module is the daemon (``spark.python.daemon.module``,
set by ``streaming.job.session.build_session`` for local masters): it imports those modules, freezes them out
of the cyclic collector's reach (as ``streaming.runtime.worker_gc`` does in each worker), then runs Spark's own
daemon loop. Forked workers start with the imports done and share their pages copy-on-write.

Only imports happen before the fork: no threads, sockets or clients, which a forked child could not use.
A module that fails to import is left for the worker to import (and fail on) as it would have anyway.
"""

from __future__ import annotations

import contextlib
import gc
import importlib

PRELOADED = (
    "crc32c",  # its __init__ asks importlib.metadata for its version: a walk of sys.path per process
    "pandas",
    "pyarrow",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.pandas.types",
    "pyspark.sql.streaming.stateful_processor",
    "pyspark.sql.streaming.stateful_processor_api_client",
    "pyspark.sql.datasource",
    "pyspark.sql.streaming.datasource",
    "pyspark.sql.worker.plan_data_source_read",
    "streamoffload.streaming.source.pulsar_source",
    "streamoffload.streaming.segmenter.segmenter_spark",
    "streamoffload.streaming.sink.sink",
    "streamoffload.streaming.source.offloaded_source",
)
"""What the job's tasks import: the source's reads, the segmenter, the sink, and Spark's Arrow glue."""


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``modules`` and freeze what exists; returns the ones that imported."""
    loaded = []
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            loaded.append(name)
    gc.collect()
    gc.freeze()
    return loaded


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
