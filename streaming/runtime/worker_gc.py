"""Python workers keep the objects that live as long as the process out of the cyclic garbage collector.

Spark's worker daemon runs ``gc.collect()`` after every task of a reused Python worker. A worker that has
imported pandas, pyarrow and pyspark.sql tracks about 85,000 objects, so each of those collections took
40-50 ms here (py-spy over ``bench/offload.py``: the largest item of the workers' CPU after the imports).
A micro-batch runs a source task, a segmenter task and a sink task per partition: 0.15-0.2 CPU seconds per
micro-batch, whatever it carries. The first task a worker process runs calls :func:`freeze_long_lived`:
one collection, then ``gc.freeze()`` moves what exists (the imported modules) out of the collector's
reach, so later collections walk only what tasks create. Task objects still die by reference counting.

The job's driver freezes too, once its SparkSession is built (``streaming.job.session``): it tracks about
140,000 objects, and each gen-2 collection of them took 40-50 ms, a pause of every driver thread (the overlapped
writes, the table follower's syncs). Frozen, one takes under 1 ms.
"""

from __future__ import annotations

import gc
import os

_frozen_in: int | None = None
"""The process that froze (a worker forked from a frozen one freezes again: its own first task's objects)."""


def freeze_long_lived() -> None:
    """Once per process: collect, then freeze every object that exists now (see the module docstring)."""
    global _frozen_in
    if _frozen_in == os.getpid():
        return
    _frozen_in = os.getpid()
    gc.collect()
    gc.freeze()


__all__ = ["freeze_long_lived"]
