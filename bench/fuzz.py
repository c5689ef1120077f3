"""The fuzz bench (issue 52): mutated objects of every kind the project stores or receives, fed to every reader
and to ``cleanup`` and ``verify`` over a filesystem store seeded with a real committed segment set.

Run from the repository root:

    .venv/bin/python bench/fuzz.py                          # 10,000 inputs per kind, a random seed (printed)
    .venv/bin/python bench/fuzz.py --seed 52 --count 60     # what tests/bench/test_fuzz.py runs per store kind
    .venv/bin/python bench/fuzz.py --kinds manifest,lease --count 1000

The store is built with the project's own writers (``bench.histories.offload``: the segmenter and the sink): a topic
with a streaming (v2) segment and a ledger-based (v1) one, a topic whose blocks are compressed at rest (zstd,
with its frame table), every block's checksum record, a writer lease (``WriterLease.acquire``) and a policy
version. Kinds: ``data-v2``, ``data-v1``, ``index-v2``, ``index-v1``, ``manifest``, ``checksums``, ``frames``
(the manifest's frame table, and a part's frame record), ``lease``, ``policy``, and ``payload-lz4``,
``payload-zlib``, ``payload-zstd``, ``payload-snappy`` (compressed batched entries). Mutations: bit flips,
truncation, extension, a length field (a u32 or u64 at a known length offset, or anywhere) set to a huge value,
an object swapped for another one (another kind's, or its sibling's); for protobuf and JSON objects also a
field set to a huge or wrong value, a key pointing at another segment's or topic's objects.

Each stored input is put in place of the original, then read by every reader of its kind: its decoder, the
segment read handle, the topic reader with each entry split into messages (``read --messages``), the
DataFrame reader (``read_task``, the Arrow batches), ``verify``'s checker (``verify_topic --crc``), and
``cleanup --grace-minutes 0``; then the store is put back as it was. A payload is read by the message
splitters (``split_messages``, the columns of ``append_messages``, the DataFrame reader's Arrow batch).

Per input, these are violations (the exit status is 1 if there is any):

- ``crash``: an exception that is not a ``StreamOffloadError``, or one whose text is more than one line or does
  not name the object (its key, file name or segment id; a payload's entry);
- ``alloc``: a ``tracemalloc`` peak above ``--bound`` (default twice ``codecs.compression.MAX_UNCOMPRESSED``);
  the process's peak resident size is printed too, which also sees the native libraries' allocations;
- ``deleted``: an object a committed segment names (its data, index, checksum records) gone after ``cleanup``.

A summary table per kind ends the run: inputs, inputs read without an error, inputs refused with a project
error, violations, the largest peak allocation. Each violation kind is printed once per (kind, reader,
exception type), with a recipe to reproduce it.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.histories import History, offload, pulsar_entries
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.lease import LeaseRecord, WriterLease
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_frames import PartFrames, decode_table
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.compression import MAX_UNCOMPRESSED, compress
from streamoffload.codecs.entry import (
    CompressionType,
    MessageMetadata,
    SingleMessageMetadata,
    decode_entry,
    encode_entry,
    split_messages,
)
from streamoffload.codecs.entry_columns import MessageColumns, append_messages
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.read.dataset_plan import ReadTask
from streamoffload.read.dataset_read import _MessageBatch, read_task
from streamoffload.read.segment.handle import SegmentReadHandle
from streamoffload.read.segment.results import SegmentKeys
from streamoffload.read.topic_reader import TopicReader
from streamoffload.read.verify import verify_topic
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.policy_versions import PolicyVersions, decode_version

PREFIX = "fuzz"
PLAIN_TOPIC = "persistent://public/default/orders-partition-0"
ZIPPED_TOPIC = "persistent://public/default/zipped-partition-0"
HOLDER = "fuzz-bench-holder"
STORE_KINDS = ("data-v2", "data-v1", "index-v2", "index-v1", "manifest", "checksums", "frames", "lease", "policy")
CODECS = {"lz4": CompressionType.LZ4, "zlib": CompressionType.ZLIB, "zstd": CompressionType.ZSTD}
CODECS["snappy"] = CompressionType.SNAPPY
PAYLOAD_KINDS = tuple(f"payload-{name}" for name in CODECS)
KINDS = STORE_KINDS + PAYLOAD_KINDS
DEFAULT_BOUND = 2 * MAX_UNCOMPRESSED
HUGE = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 1 << 40, (1 << 63) - 1, (1 << 64) - 1)
# Where formats keep lengths and counts: a block's header and block lengths and its first entry's length (v1/v2,
# SPEC 3.1), an index's lengths and counts (3.3, 3.4), a checksum record's count and a part frame record's.
LENGTH_OFFSETS = {
    "data": (4, 12, 128),
    "index": (4, 8, 16, 24, 28, 32, 36),
    "checksums": (4, 8, 12, 20, 24, 28),
}


# -- the seeded store -----------------------------------------------------------------------------------------


@dataclass
class Seeded:
    """The store as the writers left it, and what every kind of input replaces."""

    root: Path
    scoped: ScopedStore
    objects: dict[str, tuple[bytes, dict[str, str]]]
    """Every object (bytes, user metadata), to put the store back after each input."""
    protected: set[str]
    """What the committed segments name: their data, index and checksum record keys."""
    targets: dict[str, list[str]]
    """Per store kind, the keys an input of that kind replaces."""
    manifests: dict[str, SegmentManifest] = field(default_factory=dict)
    """Per manifest key, the committed manifest."""


def seed_store(root: Path) -> Seeded:
    store = FilesystemStore(root, fsync=False)
    scoped = ScopedStore(store, PREFIX)
    plain = pulsar_entries({3: 16, 4: 16}, seed=1)
    offload(scoped, plain, switch_at=16, batch=16)
    zipped = pulsar_entries({5: 16}, seed=2)
    offload(scoped, History(ZIPPED_TOPIC, zipped.entries, zipped.messages), compression="zstd")
    WriterLease(scoped, HOLDER).acquire(now_ms=1_700_000_000_000)
    policy_key = keys.prefix_meta_prefix(PREFIX, keys.POLICIES) + f"{1_700_000_000_000:020d}"
    doc = {"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 4096}, "namespaces": {}, "topics": {}}
    store.put(policy_key, json.dumps(doc, sort_keys=True).encode())

    objects = {info.key: (store.get(info.key), dict(store.head(info.key).metadata)) for info in store.list(PREFIX)}
    meta = MetadataStore(scoped)
    targets: dict[str, list[str]] = {kind: [] for kind in STORE_KINDS}
    protected: set[str] = set()
    manifests: dict[str, SegmentManifest] = {}
    for topic in (PLAIN_TOPIC, ZIPPED_TOPIC):
        for manifest in meta.offloaded_segments(topic):
            version = "v1" if keys.ledger_id_in_key(manifest.dataKey) is not None else "v2"
            records = [k for k in objects if k.startswith(keys.block_checksums_prefix(manifest.dataKey))]
            protected.update([manifest.dataKey, manifest.indexKey, *records])
            targets["checksums"] += records
            key = meta.manifest_key(manifest)
            manifests[key] = manifest
            if mf.frame_table(manifest) is not None:
                targets["frames"].append(key)
            else:
                targets[f"data-{version}"].append(manifest.dataKey)
                targets[f"index-{version}"].append(manifest.indexKey)
            targets["manifest"].append(key)
    targets["lease"] = [k for k in objects if k.startswith(keys.prefix_meta_prefix(PREFIX, keys.WRITERS))]
    targets["policy"] = [policy_key]
    for kind, found in targets.items():
        assert found, f"the seeded store has no object of kind {kind}"
    return Seeded(root, scoped, objects, protected, targets, manifests)


def restore(seeded: Seeded, key: str, present: set[str] | None) -> None:
    """Put the store back as seeded after an input replaced ``key`` (readers write nothing else); ``present``:
    what a cleanup left, when one ran."""
    store = seeded.scoped.store
    if key in seeded.objects:
        store.put(key, *seeded.objects[key])
    else:
        store.delete(key)
    if present is None:
        return
    for extra in present - seeded.objects.keys() - {key}:
        store.delete(extra)
    for missing in seeded.objects.keys() - present - {key}:
        store.put(missing, *seeded.objects[missing])


# -- mutations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    kind: str
    key: str
    data: bytes
    recipe: str


class Mutator:
    """Mutations of bytes, protobuf manifests and JSON records, drawn from one ``random.Random``."""

    def __init__(self, rnd: random.Random, pool: list[bytes]) -> None:
        self.rnd = rnd
        self.pool = pool  # objects of every kind, for swaps

    def bytes_(self, data: bytes, lengths: tuple[int, ...] = ()) -> tuple[bytes, str]:
        rnd = self.rnd
        how = rnd.choice(("flip", "flip", "truncate", "extend", "huge", "huge", "swap"))
        buf = bytearray(data)
        if how == "flip" and buf:
            bits = sorted(rnd.randrange(len(buf) * 8) for _ in range(rnd.randint(1, 8)))
            for bit in bits:
                buf[bit // 8] ^= 1 << (bit % 8)
            return bytes(buf), f"flip bits {bits}"
        if how == "truncate" or (how == "flip" and not buf):
            n = rnd.randrange(len(buf) + 1)
            return bytes(buf[:n]), f"truncate to {n} bytes"
        if how == "extend":
            tail = rnd.randbytes(rnd.randint(1, 256))
            return bytes(buf) + tail, f"extend by {tail.hex()}"
        if how == "huge":
            width = rnd.choice((4, 8))
            value = rnd.choice(HUGE) & ((1 << (8 * width)) - 1)
            spots = [o for o in lengths if o + width <= len(buf)]
            if not spots or rnd.random() < 0.3:
                spots = list(range(max(1, len(buf) - width + 1)))
            at = rnd.choice(spots)
            buf[at : at + width] = value.to_bytes(width, "big")
            return bytes(buf[: max(len(buf), at + width)]), f"set the u{8 * width} at {at} to {value:#x}"
        other = rnd.choice(self.pool)
        return other, f"swap for another object ({len(other)} bytes, CRC32 {zlib.crc32(other):08x})"

    def manifest(self, manifest: SegmentManifest, others: list[SegmentManifest]) -> tuple[bytes, str]:
        """A manifest with a field changed, re-encoded (so it frames and checks as a valid one)."""
        rnd = self.rnd
        changed = SegmentManifest()
        changed.CopyFrom(manifest)
        how = rnd.choice(("int", "int", "key", "topic", "property"))
        if how == "int":
            name = rnd.choice(
                ("dataLength", "indexLength", "blockCount", "partCount", "startEntryId", "endEntryId", "endLedgerId")
            )
            value = rnd.choice((0, 1 << 31, (1 << 63) - 1, getattr(changed, name) + 1))
            try:
                setattr(changed, name, value)
            except ValueError:  # a 32-bit field: its largest value
                value = 0x7FFFFFFF
                setattr(changed, name, value)
            recipe = f"{name} = {value}"
        elif how == "key":
            other = rnd.choice(others)
            name = rnd.choice(("dataKey", "indexKey"))
            setattr(changed, name, getattr(other, name))
            recipe = f"{name} = {getattr(other, name)}"
        elif how == "topic":
            changed.topic = rnd.choice([o.topic for o in others])
            recipe = f"topic = {changed.topic}"
        else:
            name = rnd.choice((mf.PROP_POLICY, mf.PROP_FRAMES, mf.PROP_BLOCK_CHECKSUMS, mf.PROP_INDEX_CRC))
            value = rnd.choice(("", "{", "[]", "null", "AAAA", "x" * 300, json.dumps({"a": 1 << 70})))
            changed = mf.with_driver_property(changed, name, value)
            recipe = f"driver property {name} = {value[:40]!r}"
        return mf.encode_manifest(changed), f"manifest field {recipe}"

    def frame_table(self, manifest: SegmentManifest) -> tuple[bytes, str]:
        """The manifest with its frame table's bytes mutated (then base64 again), re-encoded."""
        text = mf.driver_property(manifest, mf.PROP_FRAMES)
        assert text is not None
        raw, recipe = self.bytes_(base64.b64decode(text), tuple(range(1, 64, 9)))
        changed = mf.with_driver_property(manifest, mf.PROP_FRAMES, base64.b64encode(raw).decode())
        return mf.encode_manifest(changed), f"frame table bytes: {recipe}"

    def json_(self, data: bytes) -> tuple[bytes, str]:
        rnd = self.rnd
        if rnd.random() < 0.4:
            return self.bytes_(data)
        doc = json.loads(data)
        if not isinstance(doc, dict) or not doc:
            return self.bytes_(data)
        name = rnd.choice(sorted(doc))
        how = rnd.choice(("huge", "negative", "string", "null", "list", "drop", "nested"))
        value: Any = {
            "huge": 1 << 70,
            "negative": -1,
            "string": "x",
            "null": None,
            "list": [1],
            "nested": {"a": {"b": 1}},
        }.get(how)
        if how == "drop":
            del doc[name]
        else:
            doc[name] = value
        return json.dumps(doc).encode(), f"JSON field {name!r}: {how}"


def inputs(seeded: Seeded, kind: str, count: int, rnd: random.Random) -> Iterator[Input]:
    pool = [data for data, _ in seeded.objects.values()]
    mutator = Mutator(rnd, pool)
    others = list(seeded.manifests.values())
    if kind.startswith("payload-"):
        yield from _payload_inputs(kind, count, rnd, mutator)
        return
    targets = seeded.targets[kind]
    for _ in range(count):
        key = rnd.choice(targets)
        data = seeded.objects[key][0]
        if kind == "manifest":
            data, recipe = (
                mutator.manifest(seeded.manifests[key], others) if rnd.random() < 0.5 else mutator.bytes_(data)
            )
        elif kind == "frames":
            if rnd.random() < 0.8:
                data, recipe = mutator.frame_table(seeded.manifests[key])
            else:  # a part's frame record, as the sink writes it beside the part
                table = mf.frame_table(seeded.manifests[key]) or ()
                data, recipe = mutator.bytes_(PartFrames(tuple(table)).encode(), (5,))
                key = keys.part_frames_key(seeded.manifests[key].dataKey, 1)
                recipe = f"part frame record: {recipe}"
        elif kind in ("lease", "policy"):
            data, recipe = mutator.json_(data)
        else:
            data, recipe = mutator.bytes_(data, LENGTH_OFFSETS[kind.split("-")[0]])
        yield Input(kind, key, data, recipe)


def _payload_inputs(kind: str, count: int, rnd: random.Random, mutator: Mutator) -> Iterator[Input]:
    codec = CODECS[kind.removeprefix("payload-")]
    for i in range(count):
        n = rnd.randint(1, 5)
        parts = []
        for j in range(n):
            body = rnd.randbytes(rnd.randint(0, 40)) * rnd.randint(1, 20)
            single = SingleMessageMetadata(payload_size=len(body), sequence_id=j, partition_key=f"k{j}")
            meta = single.SerializeToString()
            parts += [len(meta).to_bytes(4, "big"), meta, body]
        batch = b"".join(parts)
        payload, recipe = mutator.bytes_(compress(codec, batch))
        declared = len(batch)
        if rnd.random() < 0.3:
            declared = rnd.choice((0, declared - 1, declared + 1, MAX_UNCOMPRESSED + 1, 200 << 20, 0xFFFFFFFF))
            recipe += f", uncompressed_size {declared}"
        count_field = n if rnd.random() < 0.8 else rnd.choice((0, n + 1, 0x7FFFFFFF))
        md = MessageMetadata(
            producer_name="fuzz",
            sequence_id=i,
            publish_time=1,
            num_messages_in_batch=count_field,
            compression=codec,
            uncompressed_size=declared,
        )
        if count_field != n:
            recipe += f", num_messages_in_batch {count_field}"
        yield Input(kind, f"entry 7:{i}", encode_entry(md, payload), f"{n} messages, {kind}: {recipe}")


# -- readers --------------------------------------------------------------------------------------------------

Reader = Callable[[Seeded, Input], None]


def _read_payload_split(seeded: Seeded, item: Input) -> None:
    split_messages(decode_entry(item.data, where=item.key), where=item.key)


def _read_payload_columns(seeded: Seeded, item: Input) -> None:
    append_messages(decode_entry(item.data, where=item.key), MessageColumns(), where=item.key)


def _read_payload_dataframe(seeded: Seeded, item: Input) -> None:
    batch = _MessageBatch("persistent://public/default/t-partition-0", 0)
    batch.add(7, 0, decode_entry(item.data, where=item.key), item.key)
    batch.to_arrow()


def _decode_object(seeded: Seeded, item: Input) -> None:
    where = item.key
    if item.kind.startswith("index-"):
        OffloadIndex.decode(item.data, ledger_id=keys.ledger_id_in_key(item.key.removesuffix("-index")), where=where)
    elif item.kind == "checksums":
        BlockChecksums.decode(item.data, where=where)
    elif item.kind == "manifest":
        mf.decode_manifest(item.data, where=where)
    elif item.kind == "frames":
        if keys.FRAMES_INFIX in item.key:
            PartFrames.decode(item.data, where=where)
        else:
            manifest = mf.decode_manifest(item.data, where=where)
            text = mf.driver_property(manifest, mf.PROP_FRAMES)
            if text is not None:
                decode_table(text, where=where)
    elif item.kind == "lease":
        LeaseRecord.decode(item.data, where=item.key)
        WriterLease(seeded.scoped, HOLDER).current()
    elif item.kind == "policy":
        PolicyVersions([(1, decode_version(item.data, where=item.key))]).policy_at(PLAIN_TOPIC, 2)


def _topics(item: Input) -> tuple[str, ...]:
    """The topics an input can change what is read of: its key's (a lease or policy record: every topic)."""
    for topic in (PLAIN_TOPIC, ZIPPED_TOPIC):
        if item.key.startswith(keys.topic_dir(PREFIX, topic)):
            return (topic,)
    return (PLAIN_TOPIC, ZIPPED_TOPIC)


def _read_handles(seeded: Seeded, item: Input) -> None:
    """The committed segment the input replaces an object of, opened by its keys alone (no manifest), read through."""
    for manifest in seeded.manifests.values():
        if mf.frame_table(manifest) is not None or not item.key.startswith(manifest.dataKey.split("-ledger-")[0]):
            continue
        segment = SegmentKeys(manifest.dataKey, manifest.indexKey, keys.ledger_id_in_key(manifest.dataKey))
        with SegmentReadHandle.open(seeded.scoped.store, segment) as handle:
            for _ in handle.read_range():
                pass


def _read_topics(seeded: Seeded, item: Input) -> None:
    """``read --messages``: every entry of every topic, split into its messages."""
    with TopicReader(seeded.scoped) as reader:
        for topic in _topics(item):
            for entry in reader.read(topic):
                split_messages(decode_entry(entry.payload, where=f"entry {entry.ledger_id}:{entry.entry_id}"))


def _read_dataframe(seeded: Seeded, item: Input) -> None:
    """The DataFrame reader: a task per Offloaded segment, as the planner makes them, read into Arrow batches."""
    meta = MetadataStore(seeded.scoped)
    for topic in _topics(item):
        for manifest in meta.offloaded_segments(topic):
            task = ReadTask(topic, mf.encode_manifest(manifest), None, None)
            for _ in read_task(seeded.scoped, task):
                pass


def _verify(seeded: Seeded, item: Input) -> None:
    for topic in _topics(item):
        verify_topic(seeded.scoped, TopicName.parse(topic), crc=True, now_ms=1_800_000_000_000)


def _cleanup(seeded: Seeded, item: Input) -> None:
    meta = MetadataStore(seeded.scoped)
    for topic in _topics(item):
        meta.cleanup(topic, grace_ms=0, at_ms=1_800_000_000_000)


PAYLOAD_READERS: dict[str, Reader] = {
    "split_messages": _read_payload_split,
    "append_messages": _read_payload_columns,
    "dataframe-batch": _read_payload_dataframe,
}
STORE_READERS: dict[str, Reader] = {
    "decoder": _decode_object,
    "segment-handle": _read_handles,
    "topic-reader": _read_topics,
    "dataframe": _read_dataframe,
    "verify": _verify,
    "cleanup": _cleanup,
}
READERS_OF = {"lease": ("decoder", "cleanup"), "policy": ("decoder",)}


# -- the run --------------------------------------------------------------------------------------------------


@dataclass
class Violation:
    kind: str
    reader: str
    what: str
    detail: str
    recipe: str
    key: str


@dataclass
class Tally:
    inputs: int = 0
    clean: int = 0
    refused: int = 0
    violations: int = 0
    max_peak: int = 0
    seconds: float = 0.0


def _names_the_object(text: str, key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    segment = name.split("-ledger-")[0][:36] if len(name) >= 36 else name
    candidates = {key, name, segment}
    if "/_meta/" in key:
        candidates.add(key.split("/_meta/")[0])  # the topic directory a metadata object belongs to
    return any(c and c in text for c in candidates)


def run_input(seeded: Seeded, item: Input, bound: int) -> tuple[bool, int, list[Violation]]:
    """Feed one input to every reader of its kind; returns (refused by some reader, peak bytes, violations)."""
    store = seeded.scoped.store
    payload = item.kind.startswith("payload-")
    readers = PAYLOAD_READERS if payload else {n: STORE_READERS[n] for n in READERS_OF.get(item.kind, STORE_READERS)}
    if not payload:
        store.put(item.key, item.data, seeded.objects.get(item.key, (b"", {}))[1])
    refused = False
    peak = 0
    peak_reader = ""
    present: set[str] | None = None
    found: list[Violation] = []
    for name, reader in readers.items():
        tracemalloc.start()
        try:
            reader(seeded, item)
        except StreamOffloadError as err:
            refused = True
            text = str(err)
            if "\n" in text:
                found.append(
                    Violation(item.kind, name, "crash", f"multi-line {type(err).__name__}", item.recipe, item.key)
                )
            elif not _names_the_object(text, item.key) and not (payload and item.key in text):
                found.append(
                    Violation(item.kind, name, "unnamed", f"{type(err).__name__}: {text[:160]}", item.recipe, item.key)
                )
        except Exception as err:  # what the bench looks for
            found.append(
                Violation(item.kind, name, "crash", f"{type(err).__name__}: {str(err)[:160]}", item.recipe, item.key)
            )
        finally:
            this = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            if this > peak:
                peak, peak_reader = this, name
        if name == "cleanup":
            present = {info.key for info in store.list(PREFIX)}
            for key in sorted(seeded.protected - present - {item.key}):
                found.append(Violation(item.kind, name, "deleted", key, item.recipe, item.key))
    if peak > bound:
        found.append(Violation(item.kind, peak_reader, "alloc", f"peak {peak} bytes", item.recipe, item.key))
    if not payload:
        restore(seeded, item.key, present)
    return refused, peak, found


def peak_rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def fuzz(
    seed: int,
    count: int,
    kinds: tuple[str, ...] = KINDS,
    bound: int = DEFAULT_BOUND,
    work_dir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Tally], list[Violation]]:
    """Run ``count`` inputs of each kind; returns the tallies and every violation. ``progress`` gets each kind's
    summary row as it is done."""
    root = Path(tempfile.mkdtemp(prefix="streamoffload-fuzz-", dir=work_dir))
    logging.disable(logging.WARNING)  # cleanup warns about every corrupt manifest it leaves alone
    try:
        seeded = seed_store(root / "store")
        # First uses (lazy imports, caches) are not an input's allocations: one unmutated input of each sort first.
        key = seeded.targets["data-v2"][0]
        run_input(seeded, Input("data-v2", key, seeded.objects[key][0], "as seeded"), bound)
        run_input(
            seeded, next(_payload_inputs("payload-zstd", 1, random.Random(0), Mutator(random.Random(0), [b""]))), bound
        )
        tallies: dict[str, Tally] = {}
        violations: list[Violation] = []
        for kind in kinds:
            rnd = random.Random(f"{seed}/{kind}")
            tally = tallies[kind] = Tally()
            started = time.perf_counter()
            for item in inputs(seeded, kind, count, rnd):
                refused, peak, found = run_input(seeded, item, bound)
                tally.inputs += 1
                tally.max_peak = max(tally.max_peak, peak)
                if found:
                    tally.violations += 1
                    violations.extend(found)
                elif refused:
                    tally.refused += 1
                else:
                    tally.clean += 1
            tally.seconds = time.perf_counter() - started
            if progress is not None:
                progress(_row(kind, tally))
        return tallies, violations
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(root, ignore_errors=True)


_HEADER = f"{'kind':16} {'inputs':>7} {'clean':>7} {'refused':>8} {'violations':>10} {'max peak B':>12} {'s':>7}"


def _row(kind: str, t: Tally) -> str:
    return f"{kind:16} {t.inputs:7} {t.clean:7} {t.refused:8} {t.violations:10} {t.max_peak:12,} {t.seconds:7.1f}"


def summary(tallies: dict[str, Tally], violations: list[Violation], bound: int) -> str:
    lines = [_HEADER, *(_row(kind, t) for kind, t in tallies.items())]
    lines.append(
        f"allocation bound {bound:,} bytes (tracemalloc peak per input); process peak RSS {peak_rss_kib():,} KiB"
    )
    seen: dict[tuple[str, str, str, str], int] = {}
    for v in violations:
        sig = (v.kind, v.reader, v.what, v.detail.split(":")[0])
        seen[sig] = seen.get(sig, 0) + 1
        if seen[sig] == 1:
            lines.append(f"VIOLATION {v.what} kind={v.kind} reader={v.reader} object={v.key}")
            lines.append(f"    {v.detail}\n    recipe: {v.recipe}")
    for sig, n in seen.items():
        if n > 1:
            lines.append(f"  ({n} inputs: {' / '.join(sig)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the seed of every input (default: a random one, printed)"
    )
    parser.add_argument("--count", type=int, default=10_000, help="inputs per kind (default 10,000)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--bound", type=int, default=DEFAULT_BOUND, help="the peak allocation allowed per input, bytes")
    parser.add_argument("--work-dir", default=None, help="where the seeded store is written (default: the temp dir)")
    args = parser.parse_args(argv)
    seed = random.SystemRandom().randrange(1 << 32) if args.seed is None else args.seed
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    print(f"fuzz: seed {seed}, {args.count} inputs per kind, kinds {', '.join(kinds)}", flush=True)
    print(_HEADER, flush=True)
    tallies, violations = fuzz(seed, args.count, kinds, args.bound, args.work_dir, lambda row: print(row, flush=True))
    print(summary(tallies, violations, args.bound))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
