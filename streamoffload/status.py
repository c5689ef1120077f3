"""Per topic-partition offload status, computed from the metadata in the store (no job needed)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.errors import StreamOffloadError


@dataclass
class TopicStatus:
    topic: str
    segments: dict[str, int] = field(default_factory=dict)
    """Count by status: Assigned, Offloaded, Failed."""
    entries: int = 0
    entry_bytes: int = 0
    data_bytes: int = 0
    first_position: list[int] | None = None
    last_offloaded_position: list[int] | None = None
    last_publish_time_ms: int = 0
    lag_seconds: float | None = None
    """Now minus the publish time of the newest offloaded entry."""
    open_segment_age_seconds: float | None = None
    deleted_ledgers: int = 0
    failures: list[str] = field(default_factory=list)
    seal_reasons: dict[str, int] = field(default_factory=dict)
    corrupt_manifests: list[str] = field(default_factory=list)
    """One line per manifest that does not decode (its key and the error); it is skipped, not counted."""
    error: str | None = None
    """Why this topic-partition's status could not be read (the other topics are still shown)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def topic_status(meta: MetadataStore, topic: str, now_ms: int | None = None) -> TopicStatus:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    status = TopicStatus(topic=topic)
    corrupt: list[CorruptManifest] = []
    manifests = meta.manifests(topic, corrupt)
    status.corrupt_manifests = [c.error for c in corrupt]
    for manifest in manifests:
        name = mf.STATUS_NAMES[manifest.status]
        status.segments[name] = status.segments.get(name, 0) + 1
        if manifest.status == mf.OFFLOADED:
            status.entries += manifest.entries
            status.entry_bytes += manifest.entryBytes
            status.data_bytes += manifest.dataLength
            status.seal_reasons[manifest.sealReason] = status.seal_reasons.get(manifest.sealReason, 0) + 1
            if status.first_position is None:
                status.first_position = [manifest.startLedgerId, manifest.startEntryId]
            status.last_offloaded_position = [manifest.endLedgerId, manifest.endEntryId]
            status.last_publish_time_ms = max(status.last_publish_time_ms, manifest.publishTimeLast)
        else:
            age = (now - manifest.assignedTimestamp) / 1000
            status.open_segment_age_seconds = max(status.open_segment_age_seconds or 0.0, age)
            if manifest.status == mf.FAILED:
                status.failures.append(f"{mf.manifest_uuid(manifest)}: {manifest.failure}")
    if status.last_publish_time_ms:
        status.lag_seconds = max(0.0, (now - status.last_publish_time_ms) / 1000)
    status.deleted_ledgers = len(meta.deleted_ledgers(topic))
    return status


def store_status(meta: MetadataStore, now_ms: int | None = None) -> list[TopicStatus]:
    """Every topic-partition's status; one whose metadata cannot be read is shown with its error instead
    of stopping the others."""
    out = []
    for topic in meta.topics():
        try:
            out.append(topic_status(meta, str(topic), now_ms))
        except StreamOffloadError as err:
            out.append(TopicStatus(topic=str(topic), error=f"{type(err).__name__}: {err}"))
    return out
