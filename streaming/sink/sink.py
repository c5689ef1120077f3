"""The sink: carries out the segmenter's actions against the object store, on Spark executors.

Order within a segment is the crash-safety argument: ``open`` starts the multipart upload and writes
the Assigned manifest recording its id (create-only: a replay keeps to what was written first);
``part`` fetches the entries its block layouts name (``streaming.sink.entry_fetch``: re-read from the broker
and checked, size and CRC-32C, against what the source read), builds the blocks and uploads them as a
numbered part into that upload (rewriting a part is harmless: the same entries make the same bytes); ``seal`` completes
the data object with the exact part list, writes the index, checks the writer still holds the lease,
commits the segment create-only in its place in the topic's history, and writes the Offloaded manifest,
last. A replayed micro-batch therefore converges on the same objects, a reader never sees half a
segment, and a fenced writer's commit is refused. No manifest is ever read and then overwritten.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from streamoffload import __version__
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import record_request_status
from streamoffload.checkpoints.lease import FencedError, check_epoch
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import FormatVersion
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import Buffer, MultipartWrite, ObjectNotFoundError, ObjectStore, buffers_size
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION
from streamoffload.streaming.control.quarantine import TopicFailedError, is_topic_specific
from streamoffload.streaming.handoff.part_layout import (
    BlockLayout,
    checksum_records,
    decode_layouts,
    part_chunks,
    part_refs,
)
from streamoffload.streaming.runtime.faults import crash_point
from streamoffload.streaming.sink.entry_fetch import EntryFetcher, PartReader, fetch_counts

log = logging.getLogger(__name__)

MANAGED_LEDGER_KEY = "managedledgername"
SOFTWARE_VERSION_KEY = "streamoffloadversion"
SEGMENT_KEY = "streamoffloadsegment"


class ReplayMismatchError(StreamOffloadError):
    """A replayed seal disagrees with the data object a failed attempt already completed."""


def managed_ledger_name(topic: str) -> str:
    """Pulsar's managed-ledger name of a topic-partition: ``tenant/namespace/persistent/local-name``."""
    name = TopicName.parse(topic)
    return f"{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"


def object_metadata(topic: str, segment: str) -> dict[str, str]:
    return {
        FORMAT_VERSION_METADATA_KEY: SUPPORTED_FORMAT_VERSION,
        # S3 metadata values are ASCII: a topic with other characters is percent-encoded here.
        MANAGED_LEDGER_KEY: quote(managed_ledger_name(topic), safe="/-._~"),
        SOFTWARE_VERSION_KEY: __version__,
        SEGMENT_KEY: segment,
    }


@dataclass
class SinkStats:
    parts: int = 0
    part_bytes: int = 0
    fetch_seconds: float = 0.0
    """Time spent fetching and checking the parts' entries (the data plane's read)."""
    spooled_entries: int = 0
    """Entries the sink took from the spool; the rest it read from the broker (``broker_entries``)."""
    broker_entries: int = 0
    broker_reads: int = 0
    sealed: list[dict[str, Any]] = field(default_factory=list)
    opened: int = 0
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic-partition figures from the segmenter (buffer, open segment, last position)."""


class _Bounded(OrderedDict[str, Any]):
    """A small LRU map: per-executor caches must not grow with the number of segments ever written."""

    def __init__(self, limit: int = 1024) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class SegmentSink:
    """Applies actions (rows with the segmenter's ``ACTION_COLUMNS``) in order."""

    def __init__(self, store: ObjectStore, key_prefix: str = "", fetcher: EntryFetcher | None = None) -> None:
        """``fetcher`` supplies the entries the parts name (the broker, in the job)."""
        self.store = store
        self.key_prefix = key_prefix
        self.fetcher = fetcher
        self.metadata = MetadataStore(store, key_prefix)
        self._uploads = _Bounded()  # data key -> the MultipartWrite its Assigned manifest recorded
        self._done = _Bounded()  # data keys whose object already exists (a replay after success)

    def apply(self, actions: Iterable[Mapping[str, Any]]) -> SinkStats:
        """Apply a task's actions in order. They are small (layouts, indexes, manifests: no entry bytes), so
        they are read ahead to find the runs of consecutive parts each topic-partition's read can cover."""
        stats = SinkStats()
        actions = list(actions)
        parts = _plan_parts(actions)
        reader = PartReader(self.fetcher) if self.fetcher is not None else None
        counts_before = fetch_counts(self.fetcher)
        try:
            for i, action in enumerate(actions):
                try:
                    self._apply_one(action, stats, reader, parts.get(i))
                except Exception as err:
                    stats.errors += 1
                    self._record_failure(action, err)
                    if is_topic_specific(err):  # the job sets this topic aside instead of stopping every topic
                        raise TopicFailedError(str(action["topic"]), err) from err
                    raise
        finally:
            if reader is not None:
                reader.close()
                stats.fetch_seconds += reader.stats.seconds
                after = fetch_counts(self.fetcher)
                stats.spooled_entries, stats.broker_entries, stats.broker_reads = (
                    a - b for a, b in zip(after, counts_before, strict=True)
                )
        return stats

    def _apply_one(
        self,
        action: Mapping[str, Any],
        stats: SinkStats,
        reader: PartReader | None = None,
        part: PlannedPart | None = None,
    ) -> None:
        kind = action["action"]
        if kind == "stats":
            stats.topics[action["topic"]] = json.loads(action["info"])
        elif kind == "open":
            self._open(mf.decode_manifest(bytes(action["manifest"])))
            crash_point("after-open")
            stats.opened += 1
        elif kind == "part":
            data_key = action["data_key"]
            if self._object_exists(data_key):
                return
            started = time.monotonic()
            info = json.loads(action["info"])
            upload = self._upload_for(data_key, info["manifest_key"])
            part = part or _plan_parts([action])[0]
            data = self._part_chunks(action["topic"], part, info, reader)
            recorded = info.get("checksums")
            if recorded is not None:
                # Before the manifest, like the part; a replay writes the same bytes under the same names.
                first, offset = int(recorded["first_block"]), int(recorded["offset"])
                for block, record in checksum_records(part.blocks, first, offset):
                    self.store.put(keys.block_checksums_key(data_key, block), record)
            upload.write_part(int(action["part_number"]), data)
            release = getattr(self.fetcher, "release", None)  # the spool: these entries are written now
            if release is not None:
                release(action["topic"], part.last)
            crash_point("after-part")
            stats.upload_seconds.append(time.monotonic() - started)
            stats.parts += 1
            stats.part_bytes += buffers_size(data)
        elif kind == "seal":
            started = time.monotonic()
            info = json.loads(action["info"])
            self._seal(action, info)
            stats.upload_seconds.append(time.monotonic() - started)
            self._requests_done(action["topic"], info.get("requests", []), action["segment"])
            info["topic"] = action["topic"]
            info["segment"] = action["segment"]
            stats.sealed.append(info)
        elif kind == "requests":
            self._requests_done(action["topic"], json.loads(action["info"])["requests"], None)
        else:
            raise ValueError(f"unknown sink action {kind!r}")

    def _part_chunks(
        self, topic: str, part: PlannedPart, info: Mapping[str, Any], reader: PartReader | None
    ) -> list[Buffer]:
        """The part's bytes, as buffers: its entries fetched and checked, then its blocks built as the layouts
        say (headers and padding around the fetched entries, not joined: the store writes them as they are)."""
        if reader is None:
            raise StreamOffloadError("this sink has no entry fetcher: it cannot write parts")
        payloads = reader.take(topic, part_refs(part.blocks), part.blocks[0].after, part.run_end)
        chunks = part_chunks(FormatVersion(int(info["format"])), part.blocks, payloads)
        expected = info.get("length")
        if expected is not None and (size := buffers_size(chunks)) != int(expected):
            raise ReplayMismatchError(f"{topic}: a part built {size} bytes, its layout says {expected}")
        return chunks

    def _object_exists(self, key: str) -> bool:
        if key in self._done:
            return True
        if self.store.exists(key):
            self._done.remember(key, True)
            return True
        return False

    def _open(self, manifest: SegmentManifest) -> None:
        """Start the segment's multipart upload and record its id in the Assigned manifest, written
        create-only. A replay finds the manifest written first and keeps to its upload; an upload this
        attempt started in vain is aborted at once (never the one holding parts)."""
        key = self.metadata.manifest_key(manifest)
        if self.store.exists(key):
            written = mf.decode_manifest(self.store.get(key), where=key)
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        segment = str(mf.manifest_uuid(manifest))
        upload = self.store.start_multipart(manifest.dataKey, object_metadata(manifest.topic, segment))
        recorded = mf.with_driver_property(manifest, mf.PROP_UPLOAD_ID, upload.upload_id)
        written = self.metadata.open_attempt(recorded)
        if mf.driver_property(written, mf.PROP_UPLOAD_ID) != upload.upload_id:
            upload.abort()
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        self._uploads.remember(manifest.dataKey, upload)

    def _resume(self, written: SegmentManifest) -> MultipartWrite:
        upload_id = mf.driver_property(written, mf.PROP_UPLOAD_ID)
        if not upload_id:
            raise StreamOffloadError(
                f"{written.topic}: segment {mf.manifest_uuid(written)} has no recorded upload id "
                "(written by an older version); run `streamoffload cleanup` and restart"
            )
        upload = self.store.resume_multipart(written.dataKey, upload_id)
        self._uploads.remember(written.dataKey, upload)
        return upload

    def _upload_for(self, data_key: str, manifest_key: str) -> MultipartWrite:
        upload = self._uploads.get(data_key)
        if upload is not None:
            return upload
        # Another executor opened the segment: its manifest says which upload holds the parts.
        try:
            written = self.store.get(manifest_key)
        except ObjectNotFoundError:
            raise FencedError(
                f"the manifest {manifest_key} of this open segment is gone: a newer writer recovered the topic "
                "and abandoned the segment, so this writer must stop"
            ) from None
        return self._resume(mf.decode_manifest(written, where=manifest_key))

    def _seal(self, action: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        data_key = action["data_key"]
        topic, segment = action["topic"], action["segment"]
        expected = int(info["data_length"])
        parts = int(action["part_number"])
        sealed = mf.decode_manifest(bytes(action["manifest"]))
        if self._object_exists(data_key):
            size = self.store.head(data_key).size
            if size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: data object {data_key} has {size} bytes but the replayed seal "
                    f"expects {expected}; the replay differs from the attempt that completed it"
                )
        else:
            upload = self._upload_for(data_key, self.metadata.manifest_key(sealed))
            written = upload.complete(list(range(1, parts + 1)))
            self._uploads.pop(data_key, None)
            self._done.remember(data_key, True)
            if written.size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: completed data object {data_key} has {written.size} bytes, "
                    f"expected {expected}"
                )
        crash_point("after-complete")
        self.store.put(action["index_key"], bytes(action["data"]), object_metadata(topic, segment))
        crash_point("after-index")
        # Fencing: a writer whose lease was taken over commits nothing; and the commit itself is
        # create-only in the segment's place in the topic's history, so two writers never both win.
        check_epoch(self.store, self.key_prefix, int(info.get("epoch", 0)))
        self.metadata.commit(sealed)

    def _requests_done(self, topic: str, request_ids: Iterable[str], segment: str | None) -> None:
        for request_id in request_ids:
            record_request_status(self.store, self.key_prefix, request_id, "done", topic=topic, segment=segment)

    def _record_failure(self, action: Mapping[str, Any], err: BaseException) -> None:
        if not action.get("segment"):
            return
        why = f"{type(err).__name__}: {err}"
        try:
            self.metadata.record_failure(action["topic"], action["segment"], why)
            if action["action"] == "seal":
                for request_id in json.loads(action["info"]).get("requests", []):
                    record_request_status(
                        self.store, self.key_prefix, request_id, "failed", topic=action["topic"], error=why
                    )
        except Exception:  # the store itself may be what failed; the next run retries the segment
            log.warning("could not record the failure of segment %s", action["segment"], exc_info=True)


@dataclass
class PlannedPart:
    """A part action's block layouts, decoded once, and where the run of consecutive parts it belongs to ends."""

    blocks: list[BlockLayout]
    run_end: tuple[int, int]

    @property
    def last(self) -> tuple[int, int]:
        return (self.blocks[-1].ledger_id, self.blocks[-1].entries[-1][0])


def _plan_parts(actions: list[Mapping[str, Any]]) -> dict[int, PlannedPart]:
    """The part actions (by index), each with the last position of the run of consecutive parts of its
    topic-partition it belongs to, so one read covers the run (``PartReader``)."""
    planned: dict[int, PlannedPart] = {}
    current: dict[str, PlannedPart] = {}  # topic -> the last part of its open run
    runs: dict[int, list[PlannedPart]] = {}  # id of a run's first part -> the run
    for i, action in enumerate(actions):
        if action["action"] != "part":
            continue
        part = PlannedPart(decode_layouts(bytes(action["data"])), (0, 0))
        previous = current.get(action["topic"])
        run = runs[id(previous)] if previous is not None and previous.last == part.blocks[0].after else []
        run.append(part)
        runs[id(part)] = run
        current[action["topic"]] = planned[i] = part
    for part in planned.values():
        part.run_end = runs[id(part)][-1].last
    return planned


_SINKS: dict[tuple[str, str, str], SegmentSink] = {}


def sink_for(store_factory: Any, key_prefix: str, fetcher_factory: Any = None) -> SegmentSink:
    """One sink (and store connection, and broker fetcher) per executor process, store and source."""
    ident = (repr(store_factory), key_prefix, repr(fetcher_factory))
    sink = _SINKS.get(ident)
    if sink is None:
        fetcher = fetcher_factory() if fetcher_factory is not None else None
        sink = _SINKS[ident] = SegmentSink(store_factory(), key_prefix, fetcher)
    return sink
