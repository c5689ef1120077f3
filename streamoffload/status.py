"""Per topic-partition offload status, computed from the metadata in the store (no job needed).

Lag, one definition everywhere (``status``, the ``streamoffload_offload_lag_seconds`` metric, the dashboard):
0 when the newest offloaded position is at or past the topic-partition's latest position (nothing
published waits: "caught up"), otherwise now minus the publish time of the newest offloaded entry, an upper
bound of the age of the oldest entry not yet offloaded. :func:`offload_lag_seconds` computes it. The latest
position comes from the broker (``status`` asks it when it knows the service URL) or from Spark's progress
(the metric); when it is unknown the second branch applies, and ``caught_up`` is ``None``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.positions import Position
from streamoffload.errors import StreamOffloadError
from streamoffload.streaming.governance.quarantine import read_records

if TYPE_CHECKING:
    from streamoffload.config import Config
    from streamoffload.table.status import TableStatus


def is_caught_up(last_offloaded: Sequence[int] | None, latest: Sequence[int] | None, latest_known: bool) -> bool | None:
    """Whether nothing published waits: ``None`` when the latest position is not known; an empty
    topic-partition (``latest`` ``None`` but known) is caught up."""
    if not latest_known:
        return None
    if latest is None:
        return True
    return last_offloaded is not None and tuple(latest) <= tuple(last_offloaded)


def offload_lag_seconds(caught_up: bool | None, last_publish_time_ms: int, now_ms: int) -> float | None:
    """The lag (module docstring): 0 when caught up, else now minus the newest offloaded publish time (``None``
    when nothing has been offloaded yet)."""
    if caught_up:
        return 0.0
    if not last_publish_time_ms:
        return None
    return max(0.0, (now_ms - last_publish_time_ms) / 1000)


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
    latest_position: list[int] | None = None
    """The topic-partition's latest position, when the broker was asked (``None`` also for an empty one)."""
    caught_up: bool | None = None
    """Nothing published waits to be offloaded; ``None`` when the latest position is unknown."""
    lag_seconds: float | None = None
    """See :func:`offload_lag_seconds`: 0 when caught up, else now minus the newest offloaded publish time."""
    open_segment_age_seconds: float | None = None
    deleted_ledgers: int = 0
    failures: list[str] = field(default_factory=list)
    seal_reasons: dict[str, int] = field(default_factory=dict)
    corrupt_manifests: list[str] = field(default_factory=list)
    """One line per manifest that does not decode (its key and the error); it is skipped, not counted."""
    error: str | None = None
    """Why this topic-partition's status could not be read (the other topics are still shown)."""
    set_aside: dict[str, Any] | None = None
    """The job's record of this topic-partition's failures in a row (``streaming.governance.quarantine``): failures,
    reason, and ``until_ms`` while it is set aside so the other topics go on."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def topic_status(
    meta: MetadataStore, topic: str, now_ms: int | None = None, latest: Mapping[str, Position | None] | None = None
) -> TopicStatus:
    """``latest``: the latest position of each topic-partition whose broker was asked (``None`` for an empty one);
    a topic-partition not in it has an unknown latest position."""
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
    known = latest is not None and topic in latest
    position = latest.get(topic) if latest is not None else None
    status.latest_position = list(position) if position is not None else None
    status.caught_up = is_caught_up(status.last_offloaded_position, position, known)
    status.lag_seconds = offload_lag_seconds(status.caught_up, status.last_publish_time_ms, now)
    status.deleted_ledgers = len(meta.deleted_ledgers(topic))
    return status


def store_status(
    meta: MetadataStore, now_ms: int | None = None, latest: Mapping[str, Position | None] | None = None
) -> list[TopicStatus]:
    """Every topic-partition's status; one whose metadata cannot be read is shown with its error instead
    of stopping the others. ``latest`` as for :func:`topic_status`."""
    out: dict[str, TopicStatus] = {}
    for topic in meta.topics():
        try:
            out[str(topic)] = topic_status(meta, str(topic), now_ms, latest)
        except StreamOffloadError as err:
            out[str(topic)] = TopicStatus(topic=str(topic), error=f"{type(err).__name__}: {err}")
    # A failing topic may have nothing in the store yet (a name the store cannot hold, say): shown all the same.
    for record in read_records(meta.scoped):
        status = out.setdefault(record.topic, TopicStatus(topic=record.topic))
        status.set_aside = asdict(record)
    return list(out.values())


def table_statuses(config: Config, meta: MetadataStore) -> list[TableStatus]:
    """The position and lag of each Iceberg table of the store's topics (``table.status``), in the catalog of
    ``config``'s ``[table]`` section (by default the embedded SQLite catalog under the store): none when that
    catalog does not exist yet, cannot be named (a store on S3 without ``[table] catalog``), or pyiceberg is not
    installed. Nothing is created: a store without tables stays without, and pyiceberg is not even imported."""
    from pathlib import Path

    from streamoffload.storage.keys import TABLES_DIR

    location = config.store.location
    if config.table.catalog is None and (
        location.scheme != "file" or not (Path(location.path) / TABLES_DIR / "catalog.db").exists()
    ):
        return []  # the embedded catalog (``table.catalog``'s default) is not there: no table
    try:
        from streamoffload.table.catalog import catalog_settings, open_catalog, sqlite_file
        from streamoffload.table.layout import identifier
        from streamoffload.table.status import table_status
    except ModuleNotFoundError:
        return []
    try:
        settings = catalog_settings(location, config.table.catalog, config.table.warehouse)
    except StreamOffloadError:
        return []
    db = sqlite_file(settings.uri)
    if db is not None and not db.exists():
        return []
    import logging

    out = []
    try:
        catalog = open_catalog(settings)
        for topic in sorted({str(t.base) for t in meta.topics()}):
            if catalog.table_exists(identifier(topic)):
                out.append(table_status(meta.scoped, catalog, topic))
    except Exception as err:  # the offload's status is shown all the same
        logging.getLogger(__name__).warning(
            "the Iceberg tables of %s are not shown: %s: %s", settings.describe(), type(err).__name__, err
        )
    return out


def latest_positions(
    service_url: str, topics: Sequence[str], client_options: Mapping[str, str] | None = None
) -> dict[str, Position | None]:
    """Ask the broker for each topic-partition's latest position (``None``: it has no entries). Topic-partitions
    the broker cannot answer for are left out (their latest position stays unknown); a broker that cannot be
    reached gives an empty mapping, after one warning. Bounded: a few seconds when the broker is away.

    All of them pipelined over the binary protocol, as the job's source asks (``latest_positions_raw``: a few
    round trips per broker, where one at a time took 178 s at 1,000 topic-partitions); what that could not
    answer one at a time; with an authentication the raw protocol does not speak, through ``pulsar-client``."""
    import logging

    from streamoffload.errors import ConfigError
    from streamoffload.pulsar.exactly_once import PulsarIOError
    from streamoffload.pulsar.latest_positions import latest_positions_raw
    from streamoffload.pulsar.raw_reader import RawClient, latest_position_raw

    log = logging.getLogger(__name__)
    options = {"operationTimeoutSeconds": "3", "connectionTimeoutMs": "2000", **dict(client_options or {})}
    try:
        client = RawClient(service_url, options)
    except ConfigError:
        return _latest_positions_one_by_one(service_url, topics, options)
    answers = latest_positions_raw(client, topics) if topics else {}
    if topics and all(isinstance(a, PulsarIOError) for a in answers.values()):
        first = next(iter(answers.values()))
        log.warning("cannot ask %s for the latest positions (%s): LAG shown with '?'", service_url, first)
        return {}
    out: dict[str, Position | None] = {}
    for topic in topics:
        answer = answers.get(topic)
        if isinstance(answer, PulsarIOError):
            try:
                answer = latest_position_raw(client, topic)
            except (OSError, PulsarIOError) as err:
                log.warning("latest position of %s unknown: %s", topic, err)
                continue
        out[topic] = answer
    return out


def _latest_positions_one_by_one(
    service_url: str, topics: Sequence[str], options: Mapping[str, str]
) -> dict[str, Position | None]:
    """``latest_positions`` through ``pulsar-client``, one topic-partition at a time."""
    import logging

    import pulsar

    from streamoffload.pulsar import client_reader
    from streamoffload.pulsar.client_options import client_kwargs, pulsar_logger

    log = logging.getLogger(__name__)
    # The client's own lines (connection refused, retried) go where every log line goes, below ERROR: the one
    # warning here says what matters, and the LAG column marks what is unknown.
    client_log = pulsar_logger().getChild("status")
    client_log.setLevel(logging.DEBUG if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else logging.CRITICAL)
    try:
        kwargs = client_kwargs(options)
        kwargs["logger"] = client_log
        client = pulsar.Client(service_url, **kwargs)
    except Exception as err:
        log.warning("cannot ask %s for the latest positions (%s): LAG without them", service_url, err)
        return {}
    out: dict[str, Position | None] = {}
    try:
        for topic in topics:
            try:
                out[topic] = client_reader.latest_position(client, topic)
            except Exception as err:
                if not out:  # the first one failed: the broker is not there; do not wait once per topic
                    log.warning("cannot ask %s for the latest positions (%s): LAG shown with '?'", service_url, err)
                    break
                log.warning("latest position of %s unknown: %s", topic, err)
    finally:
        client.close()
    return out
