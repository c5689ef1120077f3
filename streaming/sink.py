"""The sink: carries out the segmenter's actions against the object store, on Spark executors.

Order within a segment is the crash-safety argument: ``open`` writes the Assigned manifest (only if
absent: a replay must not hide a segment that the failed attempt already finished); ``part`` uploads
a numbered multipart part (rewriting a part is harmless); ``seal`` completes the data object with the
exact part list, then writes the index, then the Offloaded manifest, last. A replayed micro-batch
therefore converges on the same objects, and a reader never sees half a segment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from streamoffload import __version__
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.errors import StreamOffloadError
from streamoffload.codecs.topics import TopicName
from streamoffload.storage.base import MultipartWrite, ObjectExistsError, ObjectStore
from streamoffload.streaming.faults import crash_point

log = logging.getLogger(__name__)

FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"
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
        FORMAT_VERSION_KEY: "1",
        # S3 metadata values are ASCII: a topic with other characters is percent-encoded here.
        MANAGED_LEDGER_KEY: quote(managed_ledger_name(topic), safe="/-._~"),
        SOFTWARE_VERSION_KEY: __version__,
        SEGMENT_KEY: segment,
    }


@dataclass
class SinkStats:
    parts: int = 0
    part_bytes: int = 0
    sealed: list[dict[str, Any]] = field(default_factory=list)
    opened: int = 0
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic-partition figures from the segmenter (buffer, open segment, last position)."""


class SegmentSink:
    """Applies actions (rows with the segmenter's ``ACTION_COLUMNS``) in order."""

    def __init__(self, store: ObjectStore, key_prefix: str = "") -> None:
        self.store = store
        self.metadata = MetadataStore(store, key_prefix)
        self._uploads: dict[str, MultipartWrite] = {}
        self._done: set[str] = set()  # data keys whose object already exists (a replay after success)

    def apply(self, actions: Iterable[Mapping[str, Any]]) -> SinkStats:
        stats = SinkStats()
        for action in actions:
            try:
                self._apply_one(action, stats)
            except Exception as err:
                stats.errors += 1
                self._record_failure(action, err)
                raise
        return stats

    def _apply_one(self, action: Mapping[str, Any], stats: SinkStats) -> None:
        kind = action["action"]
        if kind == "stats":
            stats.topics[action["topic"]] = json.loads(action["info"])
        elif kind == "open":
            manifest = mf.decode_manifest(bytes(action["manifest"]))
            # A replay: the failed attempt already opened (or even finished) this segment.
            with contextlib.suppress(ObjectExistsError):
                self.store.put(self.metadata.manifest_key(manifest), bytes(action["manifest"]), if_absent=True)
            crash_point("after-open")
            stats.opened += 1
        elif kind == "part":
            data_key = action["data_key"]
            if self._object_exists(data_key):
                return
            started = time.monotonic()
            upload = self._upload_for(data_key, action["topic"], action["segment"])
            data = action["data"]
            upload.write_part(int(action["part_number"]), data)
            crash_point("after-part")
            stats.upload_seconds.append(time.monotonic() - started)
            stats.parts += 1
            stats.part_bytes += len(data)
        elif kind == "seal":
            started = time.monotonic()
            self._seal(action)
            stats.upload_seconds.append(time.monotonic() - started)
            info = json.loads(action["info"])
            info["topic"] = action["topic"]
            info["segment"] = action["segment"]
            stats.sealed.append(info)
        else:
            raise ValueError(f"unknown sink action {kind!r}")

    def _object_exists(self, key: str) -> bool:
        if key in self._done:
            return True
        if self.store.exists(key):
            self._done.add(key)
            return True
        return False

    def _upload_for(self, data_key: str, topic: str, segment: str) -> MultipartWrite:
        upload = self._uploads.get(data_key)
        if upload is not None:
            return upload
        pending = sorted(
            (p for p in self.store.pending_multiparts(data_key) if p.key == data_key), key=lambda p: p.initiated
        )
        if pending:
            # The earliest upload holds the parts of earlier micro-batches; later ones are leftovers
            # of attempts that crashed before writing anything useful.
            upload = self.store.resume_multipart(data_key, pending[0].upload_id)
            for extra in pending[1:]:
                self.store.resume_multipart(data_key, extra.upload_id).abort()
        else:
            upload = self.store.start_multipart(data_key, object_metadata(topic, segment))
        self._uploads[data_key] = upload
        return upload

    def _seal(self, action: Mapping[str, Any]) -> None:
        info = json.loads(action["info"])
        data_key = action["data_key"]
        topic, segment = action["topic"], action["segment"]
        expected = int(info["data_length"])
        parts = int(action["part_number"])
        if self._object_exists(data_key):
            size = self.store.head(data_key).size
            if size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: data object {data_key} has {size} bytes but the replayed seal "
                    f"expects {expected}; the policy changed between a crash and its replay. Delete the object "
                    "and its index (streamoffload cleanup) and restart."
                )
        else:
            upload = self._upload_for(data_key, topic, segment)
            written = upload.complete(list(range(1, parts + 1)))
            self._uploads.pop(data_key, None)
            self._done.add(data_key)
            if written.size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: completed data object {data_key} has {written.size} bytes, "
                    f"expected {expected}"
                )
        crash_point("after-complete")
        self.store.put(action["index_key"], bytes(action["data"]), object_metadata(topic, segment))
        crash_point("after-index")
        sealed = mf.decode_manifest(bytes(action["manifest"]))
        self.metadata.put_manifest(sealed)
        # A replay that differed from its failed attempt may have left another attempt behind.
        self.metadata.supersede(sealed)

    def _record_failure(self, action: Mapping[str, Any], err: BaseException) -> None:
        if not action.get("segment"):
            return
        try:
            manifest = self.metadata.manifest_by_id(action["topic"], action["segment"])
            if manifest is not None and manifest.status != mf.OFFLOADED:
                self.metadata.put_manifest(mf.failed_manifest(manifest, f"{type(err).__name__}: {err}"))
        except Exception:  # the store itself may be what failed; the query's retry will retry this
            log.warning("could not mark segment %s failed", action["segment"], exc_info=True)


_SINKS: dict[tuple[str, str], SegmentSink] = {}


def sink_for(store_factory: Any, key_prefix: str) -> SegmentSink:
    """One sink (and store connection) per executor process and store."""
    ident = (repr(store_factory), key_prefix)
    sink = _SINKS.get(ident)
    if sink is None:
        sink = _SINKS[ident] = SegmentSink(store_factory(), key_prefix)
    return sink
