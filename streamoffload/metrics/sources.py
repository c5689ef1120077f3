"""Where the metrics' inputs beyond the job's batch reports come from: latest positions (Spark's progress,
the Pulsar source's backlog file, the broker), the Spark progress listener, and the read caches' counters."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamoffload.codecs.positions import Position
from streamoffload.metrics.model import Backlog, BacklogProvider, CacheCounters
from streamoffload.streaming.source.backlog import entries_between
from streamoffload.streaming.source.offset_planner import offset_positions

log = logging.getLogger(__name__)


def _offsets(value: Any) -> dict[str, Position]:
    """A Pulsar source offset's positions (``offset_planner.offset_positions``); {} for another source's."""
    try:
        return offset_positions(value)
    except ValueError:
        return {}


def backlog_from_source_progress(source: Any) -> dict[str, Backlog]:
    """Latest and consumed positions of one ``SourceProgress`` of the Pulsar source (its
    ``latestOffset`` is what the source's ``reportLatestOffset`` returned; ``endOffset`` what the
    micro-batch consumed). Other sources (the control stream) yield nothing."""
    get = source.get if isinstance(source, Mapping) else (lambda k, d=None: getattr(source, k, d))
    latest = _offsets(get("latestOffset"))
    consumed = _offsets(get("endOffset"))
    out: dict[str, Backlog] = {}
    for topic in set(latest) | set(consumed):
        end = consumed.get(topic, (-1, -1))
        top = latest.get(topic, end)
        count, exact = entries_between(end, top)
        out[topic] = Backlog(latest=max(top, end), entries=count if exact else None)
    return out


def backlog_file_provider(path: str) -> BacklogProvider:
    """A :data:`BacklogProvider` reading the Pulsar source's ``backlogFile`` (``streaming.source.pulsar_source``
    rewrites it at every trigger and commit from Spark's source-runner process). Entry and byte
    counts are taken only where the source marks them exact."""

    def provide(_known: Sequence[str]) -> Mapping[str, Backlog]:
        from streamoffload.streaming.source.backlog import read_backlog_file

        try:
            doc = read_backlog_file(path)
        except FileNotFoundError:
            return {}  # the source writes it at its first trigger
        out: dict[str, Backlog] = {}
        for topic, part in (doc.get("partitions") or {}).items():
            latest = part.get("latest")
            exact = bool(part.get("exact"))
            out[topic] = Backlog(
                latest=(int(latest[0]), int(latest[1])) if latest else None,
                entries=int(part["entries"]) if exact and part.get("entries") is not None else None,
                bytes=int(part["bytes"]) if exact and part.get("bytes") is not None else None,
            )
        return out

    return provide


def shared_read_cache() -> CacheCounters:
    """Counters of the process-wide chunk cache of ``read.segment`` (readers share it unless
    given their own cache)."""
    from streamoffload.read.segment import shared_cache

    stats = shared_cache().stats()
    return CacheCounters(hits=stats.hits, misses=stats.misses)


def progress_listener(query_name: str, on_progress: Callable[[Any], None], on_failed: Callable[[], None]) -> Any:
    """A ``StreamingQueryListener`` telling ``on_progress`` each progress of the queries named ``query_name``,
    and ``on_failed`` when one ends with an error (``JobMetrics.on_progress`` and ``on_query_failed``)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class QueryProgressListener(StreamingQueryListener):
        def __init__(self) -> None:
            self.ids: set[str] = set()

        def onQueryStarted(self, event: Any) -> None:
            if event.name == query_name:
                self.ids.add(str(event.id))

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if progress.name == query_name:
                on_progress(progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) in self.ids:
                self.ids.discard(str(event.id))
                if event.exception:
                    on_failed()

    return QueryProgressListener()


def pulsar_backlog(service_url: str, options: Mapping[str, str], configured: Sequence[str] = ()) -> BacklogProvider:
    """The default :data:`BacklogProvider`: each topic-partition's latest position, asked from Pulsar
    (``pulsar.client_reader.latest_position``), for the partitions of the configured topics and the
    topic-partitions the metrics already know. Entries and bytes behind stay unknown (``None``): the
    Python client cannot count the entries of the ledgers in between."""

    def provide(known: Sequence[str]) -> Mapping[str, Backlog]:
        from streamoffload.pulsar import client_reader
        from streamoffload.pulsar.client_options import client_options

        client = client_reader.shared_client(service_url, client_options(options))
        names = set(known)
        for topic in configured:
            with contextlib.suppress(Exception):
                names.update(client_reader.topic_partitions(client, topic))
        out: dict[str, Backlog] = {}
        for name in sorted(names):
            try:
                out[name] = Backlog(latest=client_reader.latest_position(client, name))
            except Exception as err:
                log.debug("metrics: latest position of %s unknown: %s", name, err)
        return out

    return provide
