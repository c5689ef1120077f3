"""The ceilings of Spark's byte path on this machine: the best any PySpark pipeline of the job's old shape
(entry bytes in Spark rows) can do here, with no Pulsar in it, beside a plain pulsar-client drain measured in
the same run; and the ceilings of the positions design (docs/DESIGN.md "Control plane and data plane": the
query carries positions, the sink re-reads the bytes from the broker): the two reads and the store writes,
and the job itself.

Run from the repository root:

    .venv/bin/python bench/ceiling.py                          # 200 MB, entries of 100 KiB, 1 and 4 partitions
    .venv/bin/python bench/ceiling.py --mb 50 --repeat 1       # quick look
    .venv/bin/python bench/ceiling.py --try spark.sql.execution.arrow.maxRecordsPerBatch=100000
    .venv/bin/python bench/ceiling.py --partitions 1 --batch-mb 4,16 --no-stages --compress ""   # sources only
    .venv/bin/python bench/ceiling.py --no-shape                # the positions design's lines (and memcopy, plain, raw)
    .venv/bin/python bench/ceiling.py --no-shape --message-kb 0.25 --entry-kb 64   # 256 B messages, 256 per entry
    .venv/bin/python bench/ceiling.py --no-shape --no-job       # reads and store writes: no Spark, no memcopy

Sizes: ``--mb`` MB (10^6 B) of entries per figure, in entries of ``--entry-kb`` KiB (the in-memory source's
entry size, and the published topic's entry payload). The topic is published with messages of
``--message-kb`` KiB (default 1), batched ``--entry-kb / --message-kb`` messages per entry, which must be a
whole number: by default 100 messages of 1 KiB per 100 KiB entry, as before ``--message-kb`` existed. That is
the most per entry: the producer also flushes a batch after 10 ms, so a few entries are shorter (the entry
count and entry bytes are printed after publishing), and an entry holds each message's metadata beside its
payload.

One local[2] Spark session, built with the project's ``build_session`` (the job's confs), and the embedded
pulsar-lite broker. In alternating rounds (best of ``--repeat``), it measures MB/s of entry bytes for:

1. ``memcopy``: a plain Python loop building the source's Arrow record batches (``streaming/source/pulsar_source.py``
   ``SCHEMA``) from ``bytes`` entries, in this process: what one core does with the bytes, no Spark.
2. ``plain``: ``bench/source.py``'s ``drain_plain`` over the batched topic above (MB/s of message payload),
   the denominator of issues 11 and 12 and of every ``ratio``; ``raw``: ``read_range_raw`` over the same
   topic (the same payload bytes, so its ratio is plain's time over its own).
3. ``source``: a minimal Python streaming source (``ceiling-memory``: ``DataSourceStreamReader`` +
   ``SupportsTriggerAvailableNow``) whose ``read`` yields Arrow record batches of random entry bytes with
   the source's schema (one random buffer per task, built once and reused for every batch of the task),
   into the ``noop`` sink, ``Trigger.AvailableNow``, everything in one micro-batch. For each Arrow batch
   size (``--batch-mb``) and number of input partitions (``--partitions``; one "topic" per partition).
   ``source ∥ raw (thread|process)``: the same source, first ``--partitions`` value, while its first
   task also drains the whole topic of ``raw`` with the raw reader, in a thread of the task or in a process
   forked from it, dropping the entries. Nothing couples the two, so this is the best any overlap of a
   source's reading and its hand-over to Spark can do (issue 11's batched target); ``--no-overlap``
   skips it.
4. ``job``: the same source -> ``groupBy("topic").transformWithStateInPandas`` with a processor that keeps
   no state and concatenates each topic's entries into one ``data`` row per ~4 MiB -> ``foreachBatch``
   running ``mapInArrow`` (each ``data`` value written to a file under a temporary directory) + ``collect``,
   micro-batches of ``--trigger-mb`` (like the job's ``max_bytes_per_trigger``), with the job's state store
   settings (``streaming.job.queries.STATE_STORE_CONF``: changelog checkpointing) and ``noDataMicroBatches`` off
   (as ``run --once``). With ``spark.shuffle.compress`` true and false. To split the job's time into its
   steps: ``shuffle->noop`` is the source repartitioned by topic (the groupBy's exchange, no Python) into
   ``noop``, and ``seg->noop`` the segmenter's output into ``noop`` (everything but the sink); both for the
   first ``--partitions`` value only, unless ``--all-stages``. ``--no-shape`` skips 3 and 4 (and their
   warm-up queries) and the ``--try`` lines.

The positions design's lines. The job reads every entry twice from the broker (the source's read, which
keeps positions, sizes and CRC-32Cs, and the sink's re-read of each run of parts) and writes every byte to
the store, so these bound what it can reach on this machine; each prints CPU seconds per GB (10^9 B) of
the line's bytes, by process, beside its MB/s and its ratio to ``plain``. The ``store`` and ``positions job``
lines count entry bytes, which exceed plain's payload bytes by each message's metadata (printed after
publishing: ~2% with 1 KiB messages, ~10% with 256 B ones), so their ratios are that much high. CPU seconds
come from /proc in ticks of 0.01 s: at ``--mb 20`` one tick is 0.5 s per GB.

5. ``raw ×2``: two ``read_range_raw`` drains of the whole topic, back to back, in this process: the least
   the design costs the broker and the reader. MB/s of ONE copy of the topic (plain's payload bytes over
   the time of both drains, so the ideal is half of ``raw``); CPU of the broker and of this process per GB
   of one copy. Needs the broker (not with ``--no-broker``).
6. ``store fs`` and ``store s3``: the topic's entry bytes (as the raw reader counts them; without the
   broker, ``--mb`` MB), as random bytes, written through the job's stores the way its sink writes a data
   object: ``start_multipart``, ``write_part`` of ``--store-part-mb`` MiB parts (64: the default block,
   and so the part of a backlog on a filesystem store), ``complete``, one object per ``--store-segment-mb``
   MiB segment (64). ``store fs``: ``streamoffload.storage.filesystem.FilesystemStore`` under the work
   directory, fsync on (its default; its ``complete`` copies the parts into the object, so the disk sees
   the bytes twice); CPU of this process (the kernel's writeback threads are nobody's). ``store s3``:
   ``streamoffload.storage.s3.S3Store`` against a ``moto_server`` the bench starts
   (``bench/s3_endpoint.py``'s ``moto_endpoint``; moto keeps objects in memory and is Python on the same
   cores, so this is moto's ceiling, not S3's); CPU of this process and of moto. Index and manifest puts
   are left out (small). ``--no-store`` skips both.
7. ``positions job``: ``OffloadJob.run_once`` (``streaming/job/supervision.py``) end to end over the topic into a
   FilesystemStore, the default offload settings (``bench/offload.py``'s ``job_config`` with its
   ``--defaults``: only the store, checkpoint and topics set), after a warm-up run on a small topic. MB/s of
   the entry bytes in the sealed segments' manifests, timed (like the Spark lines) as the sum of its
   micro-batches' ``triggerExecution`` with ``run_once``'s wall time beside (query start-up, recovery,
   retention pass); CPU per GB of the JVM + Python workers (source, segmenter and sink, re-read included)
   and of the broker, apart, over the whole ``run_once``. Needs the broker; ``--no-job`` skips it.

Spark figures are the sum of the micro-batches' ``durationMs.triggerExecution`` (wall time, with query
start-up, printed beside), with the ratio to ``plain`` of the same run, the CPU seconds of the JVM and the
Python workers during the query (``bench/procstats.py``) and the largest ``durationMs`` parts.

``spark.shuffle.compress`` is read once, when the JVM's ``SerializerManager`` is built, and Spark refuses to
change it in a running session (``spark.conf.set``), so the bench sets the SerializerManager's field by
reflection before each query, and reads it back (and sets it back to true before ``positions job``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

# Run as a script: the repository root on the path, for ``bench.*``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import StructType

from bench.logs import log_beside
from bench.offload import drain_job, job_config, steady_seconds
from bench.procstats import CpuMeter, child_pids
from bench.source import drain_plain, drain_raw, end_positions
from streamoffload.codecs.positions import Position
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.storage.base import ObjectStore
from streamoffload.streaming.job.queries import STATE_STORE_CONF
from streamoffload.streaming.source.pulsar_source import SCHEMA, arrow_schema
from streamoffload.units import MIB

SOURCE_NAME = "ceiling-memory"
OUTPUT_SCHEMA = "topic string, data binary"
SINK_SCHEMA = "files long, bytes long"
SEGMENT_ROW_BYTES = 4 * MIB
"""The processor's output rows: one ``data`` value per ~4 MiB of a topic's entries (a part's size)."""

# --------------------------------------------------------------------------------------------------
# The in-memory source. Pickled by value to Spark's Python workers (this file runs as ``__main__``), so it
# uses only what they can import: pyarrow, numpy, pyspark.


def build_batch(topic: str, partition: int, first_entry: int, rows: int, entries: pa.Array, schema: pa.Schema) -> Any:
    """One record batch of the source's schema: ``rows`` entries of ``entries`` (built once per task)."""
    import numpy as np

    ids = pa.array(np.arange(first_entry, first_entry + rows, dtype=np.int64))
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * rows, pa.string()),
            pa.array(np.full(rows, partition, dtype=np.int32)),
            pa.array(np.zeros(rows, dtype=np.int64)),
            ids,
            pa.array(np.full(rows, 1_700_000_000_000_000, dtype=np.int64)).cast(schema.field("publish_time").type),
            pa.array(np.full(rows, 100, dtype=np.int32)),
            entries.slice(0, rows),
            pa.array(np.full(rows, len(entries[0].as_buffer()), dtype=np.int32)),
        ],
        schema=schema,
    )


def random_entries(rows: int, entry_bytes: int, seed: int) -> pa.Array:
    """``rows`` binary values of ``entry_bytes`` random bytes, over one buffer (no per-value copy)."""
    import numpy as np

    data = np.random.default_rng(seed).bytes(rows * entry_bytes)
    offsets = np.arange(0, (rows + 1) * entry_bytes, entry_bytes, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


class MemoryPartition(InputPartition):
    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__((index, start, end))
        self.index, self.start, self.end = index, start, end


class MemoryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets count entries per partition; each partition is one "topic" with ``total`` entries."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.schema = schema
        self.total = int(options["entriesPerPartition"])
        self.partitions_n = int(options["partitions"])
        self.batch_rows = int(options["batchRows"])
        self.entry_bytes = int(options["entryBytes"])
        self.trigger_rows = int(options.get("triggerRows", "0"))
        self.run = options.get("run", "0")
        self.also_drain = options.get("alsoDrain", "")

    def initialOffset(self) -> dict[str, int]:
        return {"entries": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.trigger_rows) if self.trigger_rows > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        at = int(start["entries"])
        if isinstance(limit, ReadMaxRows):  # rows of all partitions together, as Spark counts them
            return {"entries": min(self.total, at + max(1, limit.max_rows // self.partitions_n))}
        return {"entries": self.total}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the data never grows

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [MemoryPartition(i, int(start["entries"]), int(end["entries"])) for i in range(self.partitions_n)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, MemoryPartition)
        schema = to_arrow_schema(self.schema, timezone="UTC")
        rows = min(self.batch_rows, partition.end - partition.start)
        entries = random_entries(rows, self.entry_bytes, seed=partition.index * 1_000_003 + partition.start)
        topic = f"persistent://public/default/ceiling-{self.run}-partition-{partition.index}"
        drain = start_drain(self.also_drain) if self.also_drain and partition.index == 0 else None
        at = partition.start
        while at < partition.end:
            n = min(rows, partition.end - at)
            yield build_batch(topic, partition.index, at, n, entries, schema)
            at += n
        if drain is not None:
            drain.join()  # the task, and so the micro-batch, ends when both are done

    def commit(self, end: dict[str, int]) -> None:
        pass


def start_drain(spec: str) -> Any:
    """Read a whole topic with the raw reader and drop the entries, beside the task's batches: the
    source's read with nothing coupling it to the batches handed to Spark, so that a task running both
    shows the best any overlap of reading and ingestion can do. ``spec``:
    ``thread|serviceUrl|topic|ledger:entry|stallMs`` (a thread of the task: the GIL shared, as a real
    source's read-ahead would) or ``process|...`` (a child process: the bound with no GIL shared).
    Returns something to ``join()``."""
    import multiprocessing
    import threading

    if spec.startswith("process|"):  # forked: this function is pickled by value, not importable by name
        child = multiprocessing.get_context("fork").Process(target=drain, args=(spec,), name="ceiling-drain")
        child.start()
        return child
    thread = threading.Thread(target=drain, args=(spec,), name="ceiling-drain", daemon=True)
    thread.start()
    return thread


def drain(spec: str) -> None:
    # Not bench/source.py's drain_raw: this runs in Spark's Python worker, which cannot import ``bench``.
    from streamoffload.pulsar import raw_reader as rr
    from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, ReaderSettings

    _how, url, topic, end_text, stall_ms = spec.split("|")
    ledger, entry = (int(v) for v in end_text.split(":"))
    settings = ReaderSettings(receiver_queue_size=2000, stall_timeout_ms=int(stall_ms))
    client = rr.RawClient(url)
    try:
        for _entry in rr.read_range_raw(client, topic, BEFORE_EARLIEST, (ledger, entry), settings=settings):
            pass
    finally:
        client.close()


class MemoryDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemoryStreamReader(self.options, schema)  # case-insensitive keys


class ConcatProcessor(StatefulProcessor):
    """The segmenter's shape without its work: no state, each topic's entries joined into ~4 MiB rows."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        topic = key[0]
        out: list[bytes] = []
        pending: list[bytes] = []
        size = 0
        for frame in rows:
            for entry in frame["entry"].tolist():
                pending.append(entry)
                size += len(entry)
                if size >= SEGMENT_ROW_BYTES:
                    out.append(b"".join(pending))
                    pending, size = [], 0
                if len(out) >= 8:  # yield as it goes: at most ~32 MiB of output held here
                    yield pd.DataFrame({"topic": [topic] * len(out), "data": out})
                    out = []
        if pending:
            out.append(b"".join(pending))
        if out:
            yield pd.DataFrame({"topic": [topic] * len(out), "data": out})

    def close(self) -> None:
        pass


def file_writer(directory: str, batch_id: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The sink as a ``mapInArrow`` function: each ``data`` value written to its own file."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import uuid

        files = nbytes = 0
        tag = uuid.uuid4().hex
        for batch in batches:
            column = batch.column("data")
            for i in range(batch.num_rows):
                buf = column[i].as_buffer()
                with open(os.path.join(directory, f"{batch_id}-{tag}-{files}"), "wb") as f:
                    f.write(memoryview(buf))
                files += 1
                nbytes += buf.size
        yield pa.RecordBatch.from_pydict({"files": [files], "bytes": [nbytes]})

    return write


# --------------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Figure:
    """The best of the rounds of one measured line."""

    name: str
    seconds: float = float("inf")
    wall: float = 0.0
    nbytes: int = 0
    detail: str = ""
    rounds: list[float] = field(default_factory=list)

    def add(self, seconds: float, nbytes: int, wall: float = 0.0, detail: str = "") -> None:
        self.rounds.append(seconds)
        if seconds < self.seconds:
            self.seconds, self.nbytes, self.wall, self.detail = seconds, nbytes, wall, detail

    @property
    def mbs(self) -> float:
        return self.nbytes / 1e6 / self.seconds

    def render(self, base: Figure | None) -> str:
        text = f"  {self.name:<34} {self.nbytes / 1e6:7.1f} MB in {self.seconds:6.2f} s {self.mbs:8.1f} MB/s"
        if base is not None:
            text += f"  ratio {self.mbs / base.mbs:5.2f}"
        if self.wall:
            text += f"  (wall {self.wall:.1f} s)"
        if len(self.rounds) > 1:
            text += "  rounds " + "/".join(f"{r:.2f}" for r in self.rounds)
        if self.detail:
            text += "\n" + "\n".join(f"      {line}" for line in self.detail.splitlines())
        return text


def memcopy(entries: int, entry_bytes: int, batch_rows: int) -> float:
    """Seconds to build the source's record batches from ``bytes`` entries in one Python loop."""
    schema = arrow_schema(None)  # SCHEMA's
    pool = [os.urandom(entry_bytes) for _ in range(min(entries, 64))]
    started = time.perf_counter()
    done = 0
    while done < entries:
        n = min(batch_rows, entries - done)
        values = [pool[(done + i) % len(pool)] for i in range(n)]
        # What read_partition does with its entries' bytes: one copy into an Arrow column.
        column = pa.array(values, pa.binary())
        build_batch("t", 0, done, n, column, schema)
        done += n
    return time.perf_counter() - started


def set_shuffle_compress(spark: Any, on: bool) -> bool:
    """Flip ``spark.shuffle.compress`` in the running JVM, where Spark reads it once: the SerializerManager's
    ``compressShuffle`` (shuffle blocks, written and read) and the SparkConf (``UnsafeShuffleWriter`` reads it
    when merging spills). Returns the SerializerManager's value read back.

    Through fields only: py4j's lookup of a method on ``SparkEnv`` loads classes this classpath lacks
    (``com.google.protobuf``), and the failure kills the gateway."""
    jclass = spark._jvm.java.lang.Class

    def field(class_name: str, name: str) -> Any:
        jfield = jclass.forName(class_name).getDeclaredField(name)
        jfield.setAccessible(True)
        return jfield

    env = field("org.apache.spark.SparkEnv$", "env").get(field("org.apache.spark.SparkEnv$", "MODULE$").get(None))
    manager = field("org.apache.spark.SparkEnv", "serializerManager").get(env)
    compress = field("org.apache.spark.serializer.SerializerManager", "compressShuffle")
    compress.setBoolean(manager, on)
    field("org.apache.spark.SparkEnv", "conf").get(env).set("spark.shuffle.compress", "true" if on else "false")
    return bool(compress.getBoolean(manager))


def progress_summary(progress: list[dict[str, Any]]) -> str:
    """The micro-batches' ``durationMs`` parts (and the state operator's times), largest first."""
    parts: dict[str, int] = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            if phase != "triggerExecution":
                parts[phase] = parts.get(phase, 0) + int(ms)
        for op in p.get("stateOperators", []):
            for key in ("allUpdatesTimeMs", "commitTimeMs"):
                parts[f"state.{key}"] = parts.get(f"state.{key}", 0) + int(op.get(key, 0))
    listed = ", ".join(f"{k} {v / 1000:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 10)
    text = f"{len(progress)} micro-batch(es): {listed} s"
    if len(progress) > 1:  # a fixed cost per micro-batch shows as a floor under each batch's time
        each = "/".join(f"{p['durationMs']['triggerExecution'] / 1000:.2f}" for p in progress)
        plans = "/".join(f"{p['durationMs'].get('queryPlanning', 0) / 1000:.2f}" for p in progress)
        text += f"; each batch {each} s, of which queryPlanning {plans} s"
    return text


def run_query(spark: Any, build: Callable[[Any], Any], checkpoint: str) -> tuple[float, float, str, str]:
    """(seconds in micro-batches, wall seconds, durationMs parts, CPU by process group) of one query."""
    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    spark.conf.set(key, "false")  # as run --once: no empty batches after the data
    with CpuMeter(None) as meter:
        started = time.monotonic()
        query = build(spark).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
        wall = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    cpu = meter.used
    cpu_text = f"CPU s: jvm {cpu['jvm']:.1f}, python workers {cpu['python workers']:.1f}, driver {cpu['driver']:.1f}"
    return seconds, wall, progress_summary(progress), cpu_text


@dataclass(frozen=True)
class Shape:
    mb: float
    entry_bytes: int

    @property
    def entries(self) -> int:
        return max(1, round(self.mb * 1e6 / self.entry_bytes))


def memory_stream(
    spark: Any, shape: Shape, partitions: int, batch_mb: float, trigger_mb: float, run: str, also_drain: str = ""
) -> Any:
    per_partition = max(1, shape.entries // partitions)
    return (
        spark.readStream.format(SOURCE_NAME)
        .option("entriesPerPartition", str(per_partition))
        .option("partitions", str(partitions))
        .option("batchRows", str(max(1, int(batch_mb * MIB // shape.entry_bytes))))
        .option("entryBytes", str(shape.entry_bytes))
        .option("triggerRows", str(int(trigger_mb * MIB // shape.entry_bytes)) if trigger_mb > 0 else "0")
        .option("run", run)
        .option("alsoDrain", also_drain)
        .load()
    )


def segmented(stream: Any) -> Any:
    return stream.groupBy("topic").transformWithStateInPandas(
        statefulProcessor=ConcatProcessor(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime",  # as the job (its rollover timers)
    )


def reader_cpu(meter: CpuMeter, nbytes: int) -> str:
    """CPU seconds of a drain: the broker's and this process's (the reader and its client's threads), in all
    and per GB of ``nbytes``."""
    broker, reader = meter.used["broker"], meter.used["driver"]
    return f"CPU s: broker {broker:.1f}, reader (this process) {reader:.1f}; " + per_gb(
        nbytes, [("broker", broker), ("reader (this process)", reader)]
    )


def per_gb(nbytes: int, parts: Sequence[tuple[str, float]]) -> str:
    """``parts``' CPU seconds per GB (10^9 B) of ``nbytes``, and their total."""
    gb = max(nbytes, 1) / 1e9
    listed = ", ".join(f"{name} {seconds / gb:.2f}" for name, seconds in parts)
    return f"CPU s per GB: {listed} (total {sum(s for _n, s in parts) / gb:.2f})"


def write_objects(
    store: ObjectStore, prefix: str, total: int, part_bytes: int, segment_bytes: int, data: memoryview
) -> tuple[list[str], int]:
    """Write ``total`` bytes to ``store`` the way the sink writes data objects: one multipart upload per
    segment of ``segment_bytes`` (the last shorter), parts of ``part_bytes`` (each segment's last shorter),
    each part a prefix of ``data``. Returns the objects' keys and the number of parts."""
    keys: list[str] = []
    written = parts = 0
    while written < total:
        length = min(segment_bytes, total - written)
        key = f"{prefix}/segment-{len(keys)}"
        upload = store.start_multipart(key)
        numbers: list[int] = []
        done = 0
        while done < length:
            n = min(part_bytes, length - done)
            numbers.append(len(numbers) + 1)
            upload.write_part(numbers[-1], data[:n])
            done += n
        info = upload.complete(numbers)
        assert info.size == length, (key, info.size, length)
        keys.append(key)
        parts += len(numbers)
        written += length
    return keys, parts


def parse_list(text: str, kind: Callable[[str], Any]) -> list[Any]:
    return [kind(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200, help="MB (10^6 bytes) of entries per figure (default 200)")
    parser.add_argument(
        "--entry-kb",
        type=int,
        default=100,
        help="KiB per entry: the in-memory source's entries and the topic's entry payload (100)",
    )
    parser.add_argument(
        "--message-kb",
        type=float,
        default=1,
        help="KiB per message of the published topic, batched --entry-kb / --message-kb per entry (1; e.g. 0.25)",
    )
    parser.add_argument("--partitions", default="1,4", help="comma list of input partitions / topics (1,4)")
    parser.add_argument("--batch-mb", default="4,16,64", help="comma list of MiB per Arrow batch, source (4,16,64)")
    parser.add_argument("--job-batch-mb", type=float, default=16, help="MiB per Arrow batch in the job shape (16)")
    parser.add_argument(
        "--trigger-mb", default="64", help="comma list of MiB per micro-batch in the job shape (64; 0: one batch)"
    )
    parser.add_argument("--compress", default="true,false", help="spark.shuffle.compress values, job shape")
    parser.add_argument("--no-stages", action="store_true", help="skip the shuffle->noop and seg->noop lines")
    parser.add_argument(
        "--all-stages",
        action="store_true",
        help="shuffle->noop and seg->noop for every --partitions value (default: the first only, to stay < 5 min)",
    )
    parser.add_argument("--repeat", type=int, default=2, help="alternating rounds, best of each (default 2)")
    parser.add_argument("--stall-ms", type=int, default=1000, help="plain/raw readers' stall timeout (1000)")
    parser.add_argument(
        "--no-broker", action="store_true", help="skip plain, raw, raw ×2 and positions job (ratios then absent)"
    )
    parser.add_argument(
        "--no-shape",
        action="store_true",
        help="skip the old shape's Spark lines (source, source ∥ raw, shuffle->noop, seg->noop, job, --try)",
    )
    parser.add_argument("--no-store", action="store_true", help="skip the 'store fs' and 'store s3' lines")
    parser.add_argument("--no-s3", action="store_true", help="skip the 'store s3' line (no moto_server)")
    parser.add_argument("--store-part-mb", type=int, default=64, help="MiB per part, store lines (64: the block)")
    parser.add_argument("--store-segment-mb", type=int, default=64, help="MiB per object, store lines (64)")
    parser.add_argument("--no-job", action="store_true", help="skip the 'positions job' line (OffloadJob.run_once)")
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="skip the 'source ∥ raw' lines (the source while its task also drains the topic with the raw reader)",
    )
    parser.add_argument(
        "--try",
        dest="tries",
        action="append",
        default=[],
        metavar="CONF=VALUE[;CONF=VALUE]",
        help="runtime SQL confs for extra source and job lines (first partition count, compress on), repeatable",
    )
    args = parser.parse_args(argv)
    partitions = parse_list(args.partitions, int)
    batch_mbs = parse_list(args.batch_mb, float)
    triggers = parse_list(args.trigger_mb, float)
    compress = [v.strip().lower() == "true" for v in args.compress.split(",") if v.strip()]
    tries = [dict(kv.split("=", 1) for kv in t.split(";") if kv) for t in args.tries]
    shape = Shape(args.mb, args.entry_kb * 1024)
    message_bytes = args.message_kb * 1024
    if message_bytes != int(message_bytes) or message_bytes < 1 or shape.entry_bytes % int(message_bytes):
        parser.error(
            f"--message-kb {args.message_kb:g} is not a whole number of bytes dividing an entry of --entry-kb "
            f"{args.entry_kb} KiB ({shape.entry_bytes:,} B)"
        )
    message_bytes = int(message_bytes)
    per_entry = shape.entry_bytes // message_bytes
    messages = shape.entries * per_entry

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="bench-ceiling-")
    print(
        f"ceiling bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}, {shape.entries:,} entries of {shape.entry_bytes:,} B "
        f"({shape.entries * shape.entry_bytes / 1e6:.0f} MB) per figure, best of {args.repeat}, work dir {work}"
    )
    log_beside(work)
    from streamoffload.streaming.job.session import build_session

    # No Spark query without the old shape's lines and the positions job: no session (its JVM, ~15 s).
    spark: Any = None
    if not args.no_shape or not (args.no_job or args.no_broker):
        started = time.monotonic()
        spark = build_session(master="local[2]", app_name="bench-ceiling", work_dir=os.path.join(work, "spark"))
        spark.dataSource.register(MemoryDataSource)
        for key, value in STATE_STORE_CONF.items():
            spark.conf.set(key, value)
        print(f"session: {time.monotonic() - started:.1f} s")
    shown = (
        "spark.sql.execution.arrow.maxRecordsPerBatch",
        "spark.sql.execution.arrow.maxBytesPerBatch",
        "spark.sql.execution.arrow.useLargeVarTypes",
        "spark.sql.execution.arrow.compression.codec",
        "spark.sql.shuffle.partitions",
        "spark.io.compression.codec",
        *STATE_STORE_CONF,
    )

    def conf_value(key: str) -> str:
        try:
            return str(spark.conf.get(key))  # the value in force, default included
        except Exception:  # a core conf that was never set has no SQL default
            return "(default)"

    if spark is not None:
        print("confs: " + ", ".join(f"{k.removeprefix('spark.')}={conf_value(k)}" for k in shown))
    figures: dict[str, Figure] = {}
    out_dir = os.path.join(work, "out")
    seq = [0]

    def fig(name: str) -> Figure:
        return figures.setdefault(name, Figure(name))

    def checkpoint() -> str:
        seq[0] += 1
        return os.path.join(work, f"cp-{seq[0]}")

    def measure(name: str, nbytes: int, build: Callable[[Any], Any], confs: dict[str, str] | None = None) -> None:
        previous = {k: spark.conf.get(k, None) for k in confs or {}}
        for k, v in (confs or {}).items():
            spark.conf.set(k, v)
        try:
            seconds, wall, parts, cpu = run_query(spark, build, checkpoint())
        finally:
            for k, v in previous.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)
        fig(name).add(seconds, nbytes, wall, f"{parts}\n{cpu}")

    def source_line(
        p: int, batch_mb: float, label: str = "", confs: dict[str, str] | None = None, also_drain: str = ""
    ) -> None:
        per = max(1, shape.entries // p)
        kind = f"source ∥ raw ({also_drain.split('|')[0]})" if also_drain else "source "
        measure(
            f"{kind} {p} part, {batch_mb:g} MiB batches{label}",
            per * p * shape.entry_bytes,
            lambda s: memory_stream(s, shape, p, batch_mb, 0, str(seq[0]), also_drain).writeStream.format("noop"),
            confs,
        )

    def job_line(p: int, on: bool, trigger: float, label: str = "", confs: dict[str, str] | None = None) -> None:
        per = max(1, shape.entries // p)
        assert set_shuffle_compress(spark, on) == on

        def sink(batch_df: Any, batch_id: int) -> None:
            batch_df.mapInArrow(file_writer(out_dir, batch_id), SINK_SCHEMA).collect()

        os.makedirs(out_dir, exist_ok=True)
        measure(
            f"job     {p} part, compress {str(on).lower()}"
            + (f", {trigger:g} MiB triggers" if len(triggers) > 1 else "")
            + label,
            per * p * shape.entry_bytes,
            lambda s: segmented(
                memory_stream(s, shape, p, args.job_batch_mb, trigger, str(seq[0]))
            ).writeStream.foreachBatch(sink),
            confs,
        )
        written = sum(f.stat().st_size for f in os.scandir(out_dir))
        assert written == per * p * shape.entry_bytes, f"the sink wrote {written} bytes"
        shutil.rmtree(out_dir)

    def shuffle_line(p: int) -> None:
        per = max(1, shape.entries // p)
        assert set_shuffle_compress(spark, True)
        measure(
            f"shuffle->noop {p} part, compress true",
            per * p * shape.entry_bytes,
            lambda s: (
                memory_stream(s, shape, p, args.job_batch_mb, triggers[0], str(seq[0]))
                .repartition("topic")  # the groupBy's exchange alone: spark.sql.shuffle.partitions, by topic
                .writeStream.format("noop")
            ),
        )

    def stage_line(p: int) -> None:
        per = max(1, shape.entries // p)
        assert set_shuffle_compress(spark, True)
        measure(
            f"seg->noop {p} part, compress true",
            per * p * shape.entry_bytes,
            lambda s: segmented(
                memory_stream(s, shape, p, args.job_batch_mb, triggers[0], str(seq[0]))
            ).writeStream.format("noop"),
        )

    # The session's first queries start Python workers and import pyspark, pandas, pyarrow in them:
    # spend that on a small run of each shape, so the figures are steady state.
    if not args.no_shape:
        warm = Shape(min(args.mb, 4), shape.entry_bytes)
        started = time.monotonic()
        run_query(spark, lambda s: memory_stream(s, warm, 2, 4, 0, "w").writeStream.format("noop"), checkpoint())
        os.makedirs(out_dir, exist_ok=True)
        run_query(
            spark,
            lambda s: segmented(memory_stream(s, warm, 2, 4, 4, "w")).writeStream.foreachBatch(
                lambda df, b: df.mapInArrow(file_writer(out_dir, b), SINK_SCHEMA).collect()
            ),
            checkpoint(),
        )
        shutil.rmtree(out_dir)
        print(f"warm-up queries: {time.monotonic() - started:.1f} s")

    # bench/offload.py's job_config with its --defaults: the shipped offload settings; only the store, the
    # checkpoint and the topics are set (with defaults it reads no other field but trigger_interval, which
    # run_once's AvailableNow query does not use; the others are named in case that changes).
    job_args = argparse.Namespace(
        defaults=True,
        trigger_interval="5 seconds",
        max_bytes_per_trigger=0,
        segment_mb=None,
        block_size=None,
        store="fs",  # offload.job_config's store: a filesystem store under the work directory
    )
    stores: list[tuple[str, Callable[[], ObjectStore], int | None]] = []  # (line, opener, pid to meter)
    store_data = memoryview(b"")
    stack = contextlib.ExitStack()
    broker_cm = None if args.no_broker else EmbeddedBroker(os.path.join(work, "broker"))
    try:
        topic = "persistent://public/default/bench-ceiling"  # published with the broker
        end: Position | None = None  # these three with the broker only
        client: Any = None
        raw_client: rr.RawClient | None = None
        topic_entries = 0
        topic_entry_bytes = shape.entries * shape.entry_bytes  # without a broker: what the store lines write
        if broker_cm is not None:
            broker = stack.enter_context(broker_cm)
            summary = produce(broker.service_url, topic, messages, message_bytes, batching=True, batch_size=per_entry)
            print(
                f"published {messages:,} messages of {message_bytes:,} B batched by {per_entry} in "
                f"{summary.seconds:.1f} s"
            )
            client = stack.enter_context(contextlib.closing(client_reader.make_client(broker.service_url)))
            raw_client = rr.RawClient(broker.service_url)
            stack.callback(raw_client.close)
            end = end_positions(client, [topic])[topic]
            n_raw, topic_entry_bytes, topic_entries = drain_raw(raw_client, topic, end, args.stall_ms, 2000)
            assert n_raw == messages, (n_raw, messages)
            print(
                f"topic: {topic_entries:,} entries, {topic_entry_bytes / 1e6:.1f} MB of entry bytes (raw reader; "
                f"{messages * message_bytes / 1e6:.1f} MB of payload)"
            )
            if not args.no_job:
                started = time.monotonic()
                warm_topic = "persistent://public/default/bench-ceiling-warm"
                produce(
                    broker.service_url,
                    warm_topic,
                    max(per_entry, 2 * MIB // message_bytes),
                    message_bytes,
                    batching=True,
                    batch_size=per_entry,
                )
                config = job_config(job_args, Path(work), "warm", broker.service_url, [warm_topic])
                drain_job(spark, config)
                shutil.rmtree(config.store.root, ignore_errors=True)
                print(f"positions job warm-up (run_once on a small topic): {time.monotonic() - started:.1f} s")

        if not args.no_store:
            from streamoffload.storage.filesystem import FilesystemStore

            part_bytes, segment_bytes = args.store_part_mb * MIB, args.store_segment_mb * MIB
            store_data = memoryview(os.urandom(max(1, min(part_bytes, segment_bytes, topic_entry_bytes))))
            fs_root = os.path.join(work, "store-fs")
            stores.append(("store fs (FilesystemStore, fsync)", lambda: FilesystemStore(fs_root), None))
            if not args.no_s3:
                from bench.s3_endpoint import S3_CREDENTIALS, S3_REGION, moto_endpoint, raw_s3_client
                from streamoffload.storage.s3 import S3Store

                endpoint = stack.enter_context(moto_endpoint(Path(work) / "moto.log"))
                moto = child_pids("moto")
                raw_s3_client(endpoint).create_bucket(Bucket="bench-ceiling")
                s3 = stack.enter_context(
                    contextlib.closing(
                        S3Store(
                            "bench-ceiling", endpoint_url=endpoint, region=S3_REGION, path_style=True, **S3_CREDENTIALS
                        )
                    )
                )
                stores.append(("store s3 (S3Store, moto_server)", lambda: s3, moto[0] if len(moto) == 1 else None))

        def raw_twice(nbytes: int) -> None:
            assert raw_client is not None and end is not None  # a broker line: set with the broker
            with CpuMeter(broker.pid) as meter:
                started = time.monotonic()
                for _ in range(2):
                    n, _b, _e = drain_raw(raw_client, topic, end, args.stall_ms, 2000)
                    assert n == messages, (n, messages)
                seconds = time.monotonic() - started
            fig("raw ×2 (two read_range_raw drains)").add(seconds, nbytes, detail=reader_cpu(meter, nbytes))

        def store_line(round_no: int, name: str, opener: Callable[[], ObjectStore], server: int | None) -> None:
            store = opener()
            with CpuMeter(server) as meter:
                started = time.monotonic()
                keys, n_parts = write_objects(
                    store, f"round-{round_no}", topic_entry_bytes, part_bytes, segment_bytes, store_data
                )
                seconds = time.monotonic() - started
            parts = [("this process", meter.used["driver"])]
            if server is not None:
                parts.append(("moto", meter.used["broker"]))
            fig(name).add(
                seconds,
                topic_entry_bytes,
                detail=f"{len(keys)} object(s), {n_parts} part(s) of up to {args.store_part_mb} MiB; "
                + per_gb(topic_entry_bytes, parts),
            )
            for key in keys:  # moto holds them in memory; a filesystem store would fill the disk
                store.delete(key)

        def positions_job(round_no: int) -> None:
            assert set_shuffle_compress(spark, True)  # the session's setting, whatever the job lines left
            config = job_config(job_args, Path(work), f"positions-{round_no}", broker.service_url, [topic])
            with CpuMeter(broker.pid) as meter:
                run = drain_job(spark, config)
            assert run.entries == topic_entries, f"the job's segments hold {run.entries} of {topic_entries} entries"
            used = meter.used
            batches = sum(q.batches for q in run.queries)
            planning = sum(q.planning_s for q in run.queries)
            segmenter = sum(q.segmenter_s for q in run.queries)
            fig("positions job (run_once, fs store)").add(
                steady_seconds(run.queries),
                run.entry_bytes,
                run.wall,
                f"{run.segments} segment(s), {batches} micro-batch(es) (planning {planning:.2f} s; segmenter "
                f"operator {segmenter:.2f} task s; foreachBatch {run.batch_seconds:.2f} s, of which uploads "
                f"{run.upload_seconds:.2f} task s)\nCPU s: jvm {used['jvm']:.1f}, python "
                f"workers {used['python workers']:.1f}, broker {used['broker']:.1f}, driver {used['driver']:.1f}\n"
                + per_gb(
                    run.entry_bytes,
                    [
                        ("jvm + python workers", used["jvm"] + used["python workers"]),
                        ("broker", used["broker"]),
                        ("driver", used["driver"]),
                    ],
                ),
            )
            shutil.rmtree(config.store.root, ignore_errors=True)
            shutil.rmtree(config.spark.checkpoint, ignore_errors=True)

        for round_no in range(args.repeat):
            print(f"round {round_no + 1} of {args.repeat} (load average {os.getloadavg()[0]:.2f})", flush=True)
            if spark is not None:  # the source's schema is parsed by the session (DDL)
                rows = max(1, int(batch_mbs[0] * MIB // shape.entry_bytes))
                seconds = memcopy(shape.entries, shape.entry_bytes, rows)
                fig(f"memcopy {batch_mbs[0]:g} MiB batches").add(seconds, shape.entries * shape.entry_bytes)
            if broker_cm is not None:
                assert raw_client is not None and end is not None  # set with the broker
                with CpuMeter(broker.pid) as meter:
                    started = time.monotonic()
                    n_messages, nbytes, _entries = drain_plain(client, topic, end, args.stall_ms, 2000)
                    seconds = time.monotonic() - started
                fig("plain (pulsar-client drain)").add(seconds, nbytes, detail=reader_cpu(meter, nbytes))
                with CpuMeter(broker.pid) as meter:
                    started = time.monotonic()
                    n_raw, _b, _e = drain_raw(raw_client, topic, end, args.stall_ms, 2000)
                    seconds = time.monotonic() - started
                fig("raw (read_range_raw)").add(seconds, nbytes, detail=reader_cpu(meter, nbytes))
                assert n_messages == n_raw == messages, (n_messages, n_raw)
                raw_twice(nbytes)
            for name, opener, server in stores:
                store_line(round_no, name, opener, server)
            if broker_cm is not None and not args.no_job:
                positions_job(round_no)
            if args.no_shape:
                continue
            for p in partitions:
                for batch_mb in batch_mbs:
                    source_line(p, batch_mb)
            if broker_cm is not None and not args.no_overlap:
                assert end is not None  # set with the broker
                spec = f"{broker.service_url}|{topic}|{end[0]}:{end[1]}|{args.stall_ms}"
                for how in ("thread", "process"):
                    for batch_mb in batch_mbs:
                        source_line(partitions[0], batch_mb, also_drain=f"{how}|{spec}")
            for conf in tries:
                source_line(partitions[0], batch_mbs[-1], " + " + ";".join(f"{k}={v}" for k, v in conf.items()), conf)
            for p in partitions:
                if not args.no_stages and (args.all_stages or p == partitions[0]):
                    shuffle_line(p)
                    stage_line(p)
                for trigger in triggers:
                    for on in compress:
                        job_line(p, on, trigger)
            for conf in tries:
                job_line(partitions[0], True, triggers[0], " + " + ";".join(f"{k}={v}" for k, v in conf.items()), conf)
    finally:
        try:
            stack.close()  # the S3 store, moto, the clients, the broker, in that order
        finally:
            if spark is not None:
                spark.stop()

    base = figures.get("plain (pulsar-client drain)")
    print(
        f"\nMB/s of entry bytes (10^6 B), best of {args.repeat}; ratio to plain; load average now "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    for figure in figures.values():
        print(figure.render(base if figure is not base else None))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
