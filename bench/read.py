"""Read-path throughput and latency: the offloaded ReadHandle next to plain reads of the same objects.

Run from the repository root:

    .venv/bin/python bench/read.py                    # 1 GiB backlog on the filesystem store, then 64 MiB on S3
    .venv/bin/python bench/read.py --size-mib 256 --skip-s3

It builds an offloaded backlog with the segmenter and the sink (entries of 64 KiB-1 MiB, 64 MiB blocks,
segments of --segment-mib; the first 3/4 streaming (v2), the rest ledger-based (v1)), then prints:

- catch-up read: ``TopicReader.read(topic)`` over the whole backlog (read buffer 1 MiB, a 64 MiB chunk
  cache; by default, as on the filesystem store, no read-ahead thread; then with one) next to a plain
  sequential read of the same data object files (``f.read`` of the same buffer size), in the same
  page-cache state: one raw pass warms the cache, then raw and ours alternate and the best of each
  counts. The ratio is raw time / our time (1.0 = as fast as reading the files).
- random single-entry reads: ``TopicReader.read_entry`` latency p50/p99, warm (after the catch-up read,
  so the handle knows where entries start) and cold (a new reader, segment list already fetched), next
  to an ``os.pread`` of exactly the entry's bytes at its known offset.
- simulated remote store: the first segment read through a view of the filesystem store that waits
  --latency-ms before every ranged GET (an object store's first-byte latency), with the parallel
  read-ahead of remote stores and without.
- S3 (a local moto server; its ranged GETs read the whole object, so figures are moto's, not S3's): the
  same catch-up read against a plain GET of each whole data object.

Entries are random bytes by default (``--entries raw``), which only the CRC-32C recorded at offload can
check; ``--entries pulsar`` makes them real Pulsar entries with their 0x0e01 checksum section (what a real
broker hands out; the reader before issue 23 checked that one), ``--entries pulsar-lite`` the same without
the section (what pulsar-lite hands out). ``--crc`` reads with every entry's checksum checked, as ``read``,
``TopicReader`` and the DataFrame reader do by default (earlier figures were taken without), and adds a raw
read that computes a CRC-32C of every buffer: the floor of any reader that checks every byte.

The backlog is written under --work-dir (default /tmp) and deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamoffload.storage.location import ScopedStore

# bench.* from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.entries import Published, forget_sent, memory_sink, publish_to
from bench.s3_endpoint import S3_CREDENTIALS, S3_REGION, moto_endpoint, raw_s3_client
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.blocks import ENTRY_HEADER_LENGTH, iter_blocks
from streamoffload.codecs.entry import Message, build_entry, crc32c
from streamoffload.read.segment import ChunkCache
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState

MIB = 1024 * 1024
TOPIC = "persistent://public/bench/backlog-partition-0"


# --- building the backlog -------------------------------------------------------------------------------


def build_backlog(
    store: ObjectStore,
    total: int,
    *,
    min_entry: int,
    max_entry: int,
    segment_bytes: int,
    block_bytes: int,
    entries_per_ledger: int,
    v1_fraction: float,
    seed: int = 1,
    entry_format: str = "raw",
) -> tuple[int, int]:
    """Offload ``total`` bytes of entries through the segmenter and sink; returns (entries, payload bytes)."""
    rnd = random.Random(seed)
    pool = os.urandom(max_entry + 4096)
    state = MemoryState()
    sink = memory_sink(ScopedStore(store))  # fetches the entries from memory: the broker's part
    switch = int(total * (1 - v1_fraction))

    def policy(method: str) -> OffloadPolicy:
        return OffloadPolicy(
            method=method,
            managedLedgerOffloadMaxBlockSizeInBytes=block_bytes,
            maxSizePerOffloadSegmentMbytes=segment_bytes / MIB,
            offloadBufferMaxBytes=4 * block_bytes,
            maxOffloadSegmentRolloverTimeMinutes=1e6,
        )

    def apply(entries: list[Published], controls: list[str], method: str, now: int) -> None:
        seen = publish_to(sink, TOPIC, entries)
        actions = run_segmenter(
            TOPIC, policy(method), state, seen, controls, now_ms=now, min_part_size=store.min_part_size
        )
        sink.apply(actions)
        forget_sent(sink, TOPIC, state)  # only what a later part may name stays in memory

    written = count = 0
    ledger, entry_id = 10, 0
    batch: list[Published] = []
    batch_bytes = 0
    method = "streaming"
    now = 1_000
    while written < total:
        size = min(rnd.randint(min_entry, max_entry), total - written) or 1
        start = rnd.randrange(0, len(pool) - size)
        # A unique prefix so that no two entries are equal.
        payload = count.to_bytes(8, "big") + pool[start : start + size - 8] if size > 8 else pool[:size]
        if entry_format != "raw":
            payload = build_entry([Message(payload)], producer_name="bench", sequence_id=count, publish_time=now)
            if entry_format == "pulsar-lite":
                payload = payload[6:]  # without the 0x0e01 section
        batch.append(Published(ledger, entry_id, payload, now))
        batch_bytes += len(payload)
        written += len(payload)
        count += 1
        entry_id += 1
        if entry_id == entries_per_ledger:
            ledger, entry_id = ledger + rnd.randint(1, 3), 0
        wanted = "ledger" if written > switch else "streaming"
        if batch_bytes >= 32 * MIB or wanted != method:
            apply(batch, [], method, now)
            batch, batch_bytes, method = [], 0, wanted
            now += 1
    apply(batch, [CONTROL_SEAL], method, now)
    return count, written


# --- measuring ------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result
    finally:
        gc.enable()


def raw_read(paths: list[Path], buffer: int) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(buffer):
                total += len(chunk)
    return total


def raw_read_crc(paths: list[Path], buffer: int) -> int:
    """``raw_read`` that also computes a CRC-32C of every buffer: what checking every byte costs at least."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(buffer):
                crc32c(chunk)
                total += len(chunk)
    return total


VERIFY = False
"""``--crc``: readers check every entry's CRC-32C (the readers' default)."""


def our_read(
    store: ObjectStore, buffer: int, *, readahead: bool | None, cache_bytes: int
) -> tuple[int, int, TopicReader]:
    reader = TopicReader(
        ScopedStore(store),
        read_buffer_size=buffer,
        readahead=readahead,
        cache=ChunkCache(cache_bytes),
        verify_checksums=VERIFY,
    )
    entries = payload = 0
    for entry in reader.read(TOPIC):
        entries += 1
        payload += len(entry.payload)
    return entries, payload, reader


def plain_get(store: ObjectStore, keys: list[str]) -> int:
    return sum(len(store.get(key)) for key in keys)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def entry_locations(store: FilesystemStore, meta: MetadataStore) -> dict[tuple[int, int], tuple[Path, int, int]]:
    """Where every entry's payload lies: (file, offset, length), from decoding the data objects."""
    out: dict[tuple[int, int], tuple[Path, int, int]] = {}
    for seg in meta.offloaded_segments(TOPIC):
        path = store.root / seg.dataKey
        data = path.read_bytes()
        for block in iter_blocks(data):
            ledger = block.header.ledger_id if block.header.ledger_id is not None else seg.startLedgerId
            for e in block.entries:
                out[(ledger, e.entry_id)] = (path, block.offset + e.offset + ENTRY_HEADER_LENGTH, len(e.payload))
    return out


def latencies(fn: Callable[[Any], Any], items: list[Any]) -> list[float]:
    out = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - start)
    return out


def fmt_lat(values: list[float]) -> str:
    return f"p50 {percentile(values, 0.5) * 1e3:.3f} ms, p99 {percentile(values, 0.99) * 1e3:.3f} ms"


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def backlog_from_args(store: ObjectStore, args: argparse.Namespace, total: int, segment_mib: int) -> tuple[int, int]:
    """``build_backlog`` with the command line's entry, block and ledger sizes: (entries, payload bytes)."""
    return build_backlog(
        store,
        total,
        min_entry=args.min_entry_kib * 1024,
        max_entry=args.max_entry_kib * 1024,
        segment_bytes=segment_mib * MIB,
        block_bytes=args.block_mib * MIB,
        entries_per_ledger=args.entries_per_ledger,
        v1_fraction=0.25,
        entry_format=args.entries,
    )


# --- the filesystem bench -------------------------------------------------------------------------------


def bench_filesystem(args: argparse.Namespace, root: Path) -> None:
    store = FilesystemStore(root, fsync=False)
    total = args.size_mib * MIB
    t, (count, payload) = timed(lambda: backlog_from_args(store, args, total, args.segment_mib))
    meta = MetadataStore(ScopedStore(store))
    segments = meta.offloaded_segments(TOPIC)
    paths = [root / s.dataKey for s in segments]
    data_bytes = sum(s.dataLength for s in segments)
    v1 = sum(1 for s in segments if s.formatVersion == 1)
    print(
        f"filesystem backlog: {count:,} entries, {payload / MIB:,.0f} MiB of entries in {len(segments)} segments "
        f"({len(segments) - v1} v2, {v1} v1), {data_bytes / MIB:,.0f} MiB of data objects, built in {t:.1f} s"
    )
    buf = args.read_buffer_kib * 1024
    raw_read(paths, buf)  # warm the page cache
    variants = {
        "default (kernel read-ahead through one descriptor, no thread)": None,
        "with the read-ahead thread": True,
    }
    best = dict.fromkeys(["raw", "raw+crc", *variants], float("inf"))
    for _ in range(args.repeat):
        t_raw, n = timed(lambda: raw_read(paths, buf))
        assert n == data_bytes
        best["raw"] = min(best["raw"], t_raw)
        if VERIFY:
            t_raw, n = timed(lambda: raw_read_crc(paths, buf))
            best["raw+crc"] = min(best["raw+crc"], t_raw)
        for label, readahead in variants.items():

            def read_once(readahead: bool | None = readahead) -> tuple[int, int, TopicReader]:
                return our_read(store, buf, readahead=readahead, cache_bytes=args.cache_mib * MIB)

            t_ours, (n_entries, n_payload, reader) = timed(read_once)
            assert (n_entries, n_payload) == (count, payload), (n_entries, count)
            reader.close()
            best[label] = min(best[label], t_ours)
    raw_mbps = mbps(data_bytes, best["raw"])
    for label in variants:
        secs = best[label]
        print(
            f"catch-up read ({label}): {count / secs:,.0f} entries/s, {mbps(payload, secs):,.0f} MB/s of entries "
            f"({mbps(data_bytes, secs):,.0f} MB/s of objects) vs raw sequential read {raw_mbps:,.0f} MB/s "
            f"(ratio {best['raw'] / secs:.2f})"
            + (
                f"; vs raw read + CRC-32C of each buffer {mbps(data_bytes, best['raw+crc']):,.0f} MB/s "
                f"(ratio {best['raw+crc'] / secs:.2f})"
                if VERIFY
                else ""
            )
        )

    # Random single-entry reads.
    locations = entry_locations(store, meta)
    rnd = random.Random(7)
    sample = rnd.sample(sorted(locations), min(args.random_reads, len(locations)))

    def raw_entry(position: tuple[int, int]) -> bytes:
        path, offset, length = locations[position]
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    raw_lat = latencies(raw_entry, sample)
    warm = TopicReader(
        ScopedStore(store), read_buffer_size=buf, cache=ChunkCache(args.cache_mib * MIB), verify_checksums=VERIFY
    )
    for _ in warm.read(TOPIC):
        pass
    warm_lat = latencies(lambda p: warm.read_entry(TOPIC, p), sample)
    warm.close()
    cold_lat = []
    for position in sample[: args.cold_reads]:
        cold = TopicReader(
            ScopedStore(store), read_buffer_size=buf, cache=ChunkCache(args.cache_mib * MIB), verify_checksums=VERIFY
        )
        cold.segments(TOPIC)  # listing the manifests is not the read being measured
        start = time.perf_counter()
        cold.read_entry(TOPIC, position)
        cold_lat.append(time.perf_counter() - start)
        cold.close()
    print(f"random entry read, warm reader ({len(sample)} reads): {fmt_lat(warm_lat)} vs raw pread {fmt_lat(raw_lat)}")
    print(
        f"random entry read, cold reader ({len(cold_lat)} reads; opens the segment, walks from the nearest "
        f"block head): {fmt_lat(cold_lat)}"
    )
    ratio = statistics.median(raw_lat) / statistics.median(warm_lat)
    print(f"random entry read p50 ratio (raw pread / warm reader): {ratio:.2f}")
    if args.latency_ms > 0:
        bench_latency(args, store, meta)


class RemoteView(ObjectStore):
    """A filesystem store seen as a remote one: a fixed wait before every ranged GET, like an object
    store's first-byte latency (the wait releases the GIL, as a network wait does). It keeps the default
    ranged reader (``get_range`` per read), so it is read the way S3 is (back-to-back ranges, parallel
    read-ahead)."""

    def __init__(self, inner: FilesystemStore, latency: float) -> None:
        self._inner = inner
        self._latency = latency

    @property
    def url(self) -> str:
        return self._inner.url + "#latency"

    def get_range(self, key: str, start: int, length: int) -> bytes:
        time.sleep(self._latency)
        return self._inner.get_range(key, start, length)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def head(self, key: str) -> Any:
        return self._inner.head(key)

    def list(self, prefix: str) -> Any:
        return self._inner.list(prefix)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("read-only view")

    def delete(self, key: str) -> None:
        raise NotImplementedError("read-only view")

    def start_multipart(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("read-only view")

    def resume_multipart(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("read-only view")

    def pending_multiparts(self, prefix: str) -> Any:
        return iter(())


def bench_latency(args: argparse.Namespace, store: FilesystemStore, meta: MetadataStore) -> None:
    """Read-ahead against per-GET latency: the first segment through a store that waits before each GET."""
    remote = RemoteView(store, args.latency_ms / 1000)
    first = meta.offloaded_segments(TOPIC)[0]
    end = (first.endLedgerId, first.endEntryId)
    buf = args.read_buffer_kib * 1024
    results = {}
    for label, readahead in (("read-ahead (default)", None), ("no read-ahead", False)):
        reader = TopicReader(
            ScopedStore(remote), read_buffer_size=buf, readahead=readahead, cache=ChunkCache(0), verify_checksums=VERIFY
        )
        start = time.perf_counter()
        n = sum(len(e.payload) for e in reader.read(TOPIC, None, end))
        results[label] = (time.perf_counter() - start, n, reader.stats.gets)
        reader.close()
    (t_on, n, gets), (t_off, _, _) = results["read-ahead (default)"], results["no read-ahead"]
    depth = 4  # the default read-ahead window is 4 read buffers
    print(
        f"simulated remote store (filesystem + {args.latency_ms:g} ms before each GET, {n / MIB:,.0f} MiB, {gets} "
        f"GETs): read-ahead ({depth} GETs in flight) {mbps(n, t_on):,.0f} MB/s vs no read-ahead "
        f"{mbps(n, t_off):,.0f} MB/s (speed-up {t_off / t_on:.1f}x; one GET at a time is bounded by "
        f"{buf / (args.latency_ms / 1000) / 1e6:,.0f} MB/s)"
    )


# --- the S3 bench ---------------------------------------------------------------------------------------


def bench_s3(args: argparse.Namespace, work: Path) -> None:
    from streamoffload.storage.s3 import S3Store

    with moto_endpoint(work / "moto.log") as endpoint:
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        raw_s3_client(endpoint).create_bucket(Bucket=bucket)
        store = S3Store(bucket, endpoint_url=endpoint, region=S3_REGION, path_style=True, **S3_CREDENTIALS)
        total = args.s3_size_mib * MIB
        t, (count, payload) = timed(lambda: backlog_from_args(store, args, total, args.s3_segment_mib))
        segments = MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC)
        keys = [s.dataKey for s in segments]
        data_bytes = sum(s.dataLength for s in segments)
        print(
            f"S3 (moto) backlog: {count:,} entries, {payload / MIB:,.0f} MiB in {len(segments)} segments, "
            f"built in {t:.1f} s"
        )
        buf = args.read_buffer_kib * 1024
        best_get = float("inf")
        big = args.s3_big_buffer_mib * MIB
        variants = {
            f"read-ahead thread (default for S3), {buf // 1024} KiB GETs": (None, buf),
            f"no read-ahead, {buf // 1024} KiB GETs": (False, buf),
            f"read-ahead thread, {big // MIB} MiB GETs": (None, big),
        }
        best = dict.fromkeys(variants, float("inf"))
        gets = dict.fromkeys(variants, 0)
        for _ in range(args.s3_repeat):
            t_get, n = timed(lambda: plain_get(store, keys))
            assert n == data_bytes
            best_get = min(best_get, t_get)
            for label, (readahead, size) in variants.items():

                def read_once(readahead: bool | None = readahead, size: int = size) -> tuple[int, int, TopicReader]:
                    return our_read(store, size, readahead=readahead, cache_bytes=args.cache_mib * MIB)

                t_ours, (n_entries, n_payload, reader) = timed(read_once)
                assert (n_entries, n_payload) == (count, payload)
                gets[label] = reader.stats.gets
                reader.close()
                best[label] = min(best[label], t_ours)
        for label in variants:
            secs = best[label]
            print(
                f"S3 catch-up read ({label}): {count / secs:,.0f} entries/s, {mbps(payload, secs):,.0f} MB/s of "
                f"entries ({gets[label]} ranged GETs) vs plain GET of each whole object "
                f"{mbps(data_bytes, best_get):,.0f} MB/s ({len(keys)} GETs) (ratio {best_get / secs:.2f})"
            )
        sample = random.Random(3).sample(_positions(store), min(args.s3_random_reads, count))
        warm = TopicReader(
            ScopedStore(store), read_buffer_size=buf, cache=ChunkCache(args.cache_mib * MIB), verify_checksums=VERIFY
        )
        for _ in warm.read(TOPIC):
            pass
        warm_lat = latencies(lambda p: warm.read_entry(TOPIC, p), sample)
        warm.close()
        print(
            f"S3 random entry read, warm reader ({len(sample)} reads, cache {args.cache_mib} MiB): {fmt_lat(warm_lat)}"
        )
        store.close()


def _positions(store: ObjectStore) -> list[tuple[int, int]]:
    reader = TopicReader(ScopedStore(store), cache=ChunkCache(0), readahead=True, verify_checksums=VERIFY)
    try:
        return [e.position for e in reader.read(TOPIC)]
    finally:
        reader.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="filesystem backlog size (default: %(default)s)")
    parser.add_argument("--s3-size-mib", type=int, default=64, help="S3 backlog size (default: %(default)s)")
    parser.add_argument("--min-entry-kib", type=int, default=64)
    parser.add_argument("--max-entry-kib", type=int, default=1024)
    parser.add_argument("--segment-mib", type=int, default=256, help="maxSizePerOffloadSegmentMbytes (filesystem)")
    parser.add_argument("--s3-segment-mib", type=int, default=16, help="maxSizePerOffloadSegmentMbytes (S3)")
    parser.add_argument("--block-mib", type=int, default=64, help="managedLedgerOffloadMaxBlockSizeInBytes in MiB")
    parser.add_argument("--entries-per-ledger", type=int, default=600)
    parser.add_argument("--read-buffer-kib", type=int, default=1024, help="managedLedgerOffloadReadBufferSizeInBytes")
    parser.add_argument("--cache-mib", type=int, default=64, help="chunk cache bound")
    parser.add_argument("--repeat", type=int, default=5, help="measured runs of each side (best counts)")
    parser.add_argument("--s3-repeat", type=int, default=2, help="the same for S3 (moto is slow)")
    parser.add_argument("--random-reads", type=int, default=1000)
    parser.add_argument("--cold-reads", type=int, default=100)
    parser.add_argument("--s3-random-reads", type=int, default=100)
    parser.add_argument(
        "--s3-big-buffer-mib", type=int, default=8, help="read buffer of the extra S3 line (default: %(default)s)"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=10.0, help="per-GET wait of the simulated remote store (0: skip)"
    )
    parser.add_argument("--entries", choices=["raw", "pulsar", "pulsar-lite"], default="raw", help="entry bytes")
    parser.add_argument("--crc", action="store_true", help="readers check every entry's CRC-32C (their default)")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--skip-filesystem", action="store_true")
    parser.add_argument("--work-dir", default="/tmp", help="where the backlog is written (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the backlog afterwards")
    args = parser.parse_args()
    global VERIFY
    VERIFY = args.crc

    work = Path(tempfile.mkdtemp(prefix="streamoffload-bench-read-", dir=args.work_dir))
    print(
        f"read bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, read buffer {args.read_buffer_kib} KiB, "
        f"entries {args.min_entry_kib}-{args.max_entry_kib} KiB, blocks {args.block_mib} MiB, best of {args.repeat} "
        f"(S3: {args.s3_repeat}), entries {args.entries}, checksums {'checked' if args.crc else 'not checked'}"
    )
    try:
        if not args.skip_filesystem:
            bench_filesystem(args, work / "store")
        if not args.skip_s3:
            bench_s3(args, work)
    finally:
        if args.keep:
            print(f"backlog kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
