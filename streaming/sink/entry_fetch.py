"""The sink's data plane: fetch the entries a part names, byte for byte, and check them.

The offload query carries positions, sizes and CRC-32Cs (the source's ``positionsOnly`` rows), not
bytes. When the sink writes a part it fetches exactly that part's entries through an
:class:`EntryFetcher` and checks each one's size and CRC-32C against what the source saw
(:func:`checked`) before a block is built from it. Ledger entries are immutable, so a second read of
the same positions returns the same bytes; anything else (a changed or resized entry, an entry the
broker no longer has) fails the topic-partition with one line naming the position, and nothing wrong
is committed: the part is not written, the segment is not sealed, the next run reads the range again.

Fetchers:
- :class:`BrokerFetcher`: re-reads the exact range ``(after, last]`` from the broker with the
  source's reader (the raw reader by default, ``pulsar-client`` as the fallback), through the same
  exactly-once range loop the source uses (duplicates dropped, stalls re-opened, loss confirmed);
- :class:`MemoryFetcher`: entries held in memory (tests, and building a store without a broker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from streamoffload.codecs.entry import crc32c
from streamoffload.codecs.positions import Position
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, DataLossError, ReaderSettings
from streamoffload.redaction import redact
from streamoffload.storage.base import Buffer
from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.governance.rate_limits import RateLimiter, RateLimitSpec, limiter_for, throttled_reads
from streamoffload.streaming.handoff.entry import Entry, EntryFetcher
from streamoffload.streaming.runtime.faults import fetch_fault, with_fetch_fault

log = logging.getLogger(__name__)


class EntryChangedError(StreamingError):
    """A fetched entry is not the entry the source read: another size or another CRC-32C."""


class EntryGoneError(DataLossError):
    """An entry the source read is no longer on the broker when the sink fetches it."""


@runtime_checkable
class ReleasingFetcher(EntryFetcher, Protocol):
    """A fetcher that keeps entries until the sink has written them (``streaming.handoff.spool.SpoolFetcher``)."""

    def release(self, topic: str, upto: Position) -> None:
        """Every entry of ``topic`` up to ``upto`` is written: what holds only those may go."""
        ...


def checked(topic: str, ref: Entry, data: Buffer, source: str) -> Buffer:
    """``data`` if it is the entry ``ref`` describes, else :class:`EntryChangedError` naming it."""
    if len(data) != ref.size:
        raise EntryChangedError(
            f"{topic}: entry {ref.ledger_id}:{ref.entry_id} fetched from {source} has {len(data)} bytes, but the "
            f"source read {ref.size}; nothing of it was written, the range is read again"
        )
    crc = crc32c(data)
    if crc != ref.crc32c:
        raise EntryChangedError(
            f"{topic}: entry {ref.ledger_id}:{ref.entry_id} fetched from {source} has CRC-32C {crc:#010x}, but the "
            f"source read {ref.crc32c:#010x}; nothing of it was written, the range is read again"
        )
    return data


def match(topic: str, refs: Sequence[Entry], delivered: Iterable[tuple[Position, Buffer]], source: str) -> list[Buffer]:
    """Pick ``refs``' entries out of a position-ordered delivery, checking each; entries the delivery has and
    ``refs`` does not (a gap the source skipped with ``failOnDataLoss=false``) are passed over."""
    out: list[Buffer] = []
    i = 0
    for pos, data in delivered:
        while i < len(refs) and refs[i].position < pos:
            _gone(topic, refs[i], source)
        if i == len(refs):
            break
        ref = refs[i]
        if ref.position == pos:
            out.append(checked(topic, ref, data, source))
            i += 1
            if i == len(refs):
                break
    if i < len(refs):
        _gone(topic, refs[i], source)
    return out


def _gone(topic: str, ref: Entry, source: str) -> None:
    raise EntryGoneError(
        f"{topic}: entry {ref.ledger_id}:{ref.entry_id}, read by the source, is gone from {source} when the sink "
        "fetched it (the broker's retention trimmed it before it was offloaded?); keep the broker's retention "
        'well above the offload lag (README "Operating")'
    )


@dataclass
class FetchStats:
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """A fetcher's stats are shared by the sink's threads (``sink.SINK_THREADS``)."""


@dataclass
class BrokerFetcher:
    """Re-reads a part's exact range from the broker (the source's reader and connection settings)."""

    service_url: str
    client_options: Mapping[str, str] = field(default_factory=dict)
    settings: ReaderSettings = field(default_factory=ReaderSettings)
    reader: str = "raw"
    stats: FetchStats = field(default_factory=FetchStats)
    limiter: RateLimiter | None = None
    """The job's read limits (``streaming.governance.rate_limits``): a re-read is a read from the broker too."""
    _client: Any = None

    def _read_range(self) -> tuple[Any, Any]:
        if self.reader == "raw":
            from streamoffload.pulsar import raw_reader as rr

            if self._client is None:
                self._client = rr.RawClient(self.service_url, dict(self.client_options))
            return self._client, rr.read_range_raw
        from streamoffload.pulsar import client_reader

        return client_reader.shared_client(self.service_url, dict(self.client_options)), client_reader.read_range

    @property
    def source(self) -> str:
        return f"the broker at {redact(self.service_url)}"

    def stream(self, topic: str, after: Position, end: Position) -> Iterator[tuple[Position, bytes]]:
        client, read_range = self._read_range()
        with self.stats.lock:
            self.stats.reads += 1
        read = read_range(client, topic, after, end, settings=self.settings, end_is_known=True)
        try:
            entries = throttled_reads(self.limiter, topic, _counted(read, self.stats), lambda e: len(e.payload))
            delivered = (((e.ledger_id, e.entry_id), e.payload) for e in entries)
            yield from with_fetch_fault(fetch_fault(topic), delivered)  # tests only; unset, one lookup
        finally:
            read.close()  # its consumer and connection, when the sink stops early


def _counted(entries: Iterator[Any], stats: FetchStats) -> Iterator[Any]:
    for entry in entries:
        with stats.lock:
            stats.entries += 1
            stats.bytes += len(entry.payload)
        yield entry


@runtime_checkable
class CountingFetcher(EntryFetcher, Protocol):
    """A fetcher that counts what it reads from the broker (:class:`BrokerFetcher`)."""

    stats: FetchStats


@runtime_checkable
class CachingFetcher(EntryFetcher, Protocol):
    """A cache in front of another fetcher (``streaming.handoff.spool.SpoolFetcher``): what it served itself,
    and the fetcher it asks for the rest, and again for what it got wrong (:meth:`PartReader.take`)."""

    spooled: int
    fallback: EntryFetcher

    def holds(self, topic: str, after: Position, end: Position) -> bool:
        """Whether the cache serves all of ``(after, end]`` itself, mapped, allocating none of its entries."""


def fetch_counts(fetcher: EntryFetcher | None) -> tuple[int, int, int]:
    """(entries from a spool, entries read from the broker, broker reads) a fetcher has served so far (none
    without a fetcher, or from one that counts nothing: a ``MemoryFetcher``)."""
    spooled = 0
    if isinstance(fetcher, CachingFetcher):
        spooled, fetcher = fetcher.spooled, fetcher.fallback
    if not isinstance(fetcher, CountingFetcher):
        return spooled, 0, 0
    return spooled, fetcher.stats.entries, fetcher.stats.reads


class MemoryFetcher:
    """Entries held in memory, by topic and position (tests; offloading entries already at hand)."""

    def __init__(self, entries: Mapping[str, Mapping[Position, bytes]] | None = None) -> None:
        self.entries: dict[str, dict[Position, bytes]] = {t: dict(e) for t, e in (entries or {}).items()}

    def add(self, topic: str, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.entries.setdefault(topic, {})[(ledger_id, entry_id)] = bytes(data)

    source = "memory"

    def stream(self, topic: str, after: Position, end: Position) -> Iterator[tuple[Position, bytes]]:
        held = self.entries.get(topic, {})
        for position in sorted(p for p in held if after < p <= end):
            yield position, held[position]


class PartReader:
    """Takes parts' entries from one stream per topic-partition: consecutive parts (each one's ``after`` the
    last position of the one before, as the segmenter cuts them) share one read of the broker, which
    costs one subscription, not one per part. Memory: one part's entries at a time."""

    def __init__(self, fetcher: EntryFetcher) -> None:
        self.fetcher = fetcher
        self._open: dict[str, tuple[Iterator[tuple[Position, Buffer]], Position, Position]] = {}
        self.stats = FetchStats()

    def take(self, topic: str, refs: Sequence[Entry], after: Position, run_end: Position) -> list[Buffer]:
        """The checked bytes of ``refs``; ``run_end`` is the last position of the run of consecutive parts
        this one begins or continues (a new stream reads ``(after, run_end]``)."""
        if not refs:
            return []
        started = time.monotonic()
        first = refs[0].position
        if after == BEFORE_EARLIEST and first[1] > 0:
            # No earlier position known (a source started at ``latest``): read from just before the first
            # entry, not from the topic's earliest.
            after = (first[0], first[1] - 1)
        current = self._open.get(topic)
        if current is None or current[1] != after or refs[-1].position > current[2]:
            self.close(topic)
            end = max(run_end, refs[-1].position)
            current = (iter(self.fetcher.stream(topic, after, end)), after, end)
        stream, _, end = current
        try:
            out = match(topic, refs, stream, self.fetcher.source)
        except (EntryChangedError, EntryGoneError) as err:
            self._open[topic] = current
            self.close(topic)
            if not isinstance(self.fetcher, CachingFetcher):
                raise
            # A spool is a cache: what it got wrong the broker is asked for (and checked) once more.
            log.warning("%s; reading the part from the broker instead", err)
            out = fetch(self.fetcher.fallback, topic, refs, after)
        except BaseException:
            self._open[topic] = current
            self.close(topic)
            raise
        else:
            self._open[topic] = (stream, refs[-1].position, end)
            if refs[-1].position >= end:
                self.close(topic)
        self.stats.entries += len(out)
        self.stats.bytes += sum(len(d) for d in out)
        self.stats.seconds += time.monotonic() - started
        return out

    def close(self, topic: str | None = None) -> None:
        for name in [topic] if topic is not None else list(self._open):
            current = self._open.pop(name, None)
            close = getattr(current[0], "close", None) if current is not None else None
            if close is not None:
                close()


class FetcherOptions(Protocol):
    """What the sink's fetcher takes of the source's options (``streaming.source.source_options.SourceOptions``,
    which the sink may not import: the stages are independent)."""

    @property
    def service_url(self) -> str: ...
    @property
    def client_options(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def reader(self) -> str: ...
    @property
    def positions_only(self) -> bool: ...
    @property
    def spool_dir(self) -> str | None: ...
    @property
    def rate_limits(self) -> RateLimitSpec | None: ...

    def reader_settings(self) -> ReaderSettings: ...


@dataclass(frozen=True)
class BrokerFetcherSpec:
    """How an executor makes its :class:`BrokerFetcher`: picklable, and its ``repr`` names it (``sink_for``)."""

    service_url: str
    client_options: tuple[tuple[str, str], ...] = ()
    settings: ReaderSettings = field(default_factory=ReaderSettings)
    reader: str = "raw"
    spool_dir: str | None = None
    """Where the source tasks spool the bytes they read (``streaming.handoff.spool``): read there first."""
    rate_limits: RateLimitSpec | None = None
    """The job's rate limits, for the re-reads (read) and the sink's uploads (``sink.sink_for``)."""

    @classmethod
    def of(cls, options: FetcherOptions) -> BrokerFetcherSpec:
        """The fetcher that reads as the source does (``SourceOptions``: its reader, connection, settings and
        spool)."""
        return cls(
            options.service_url,
            tuple(options.client_options),
            options.reader_settings(),
            options.reader,
            options.spool_dir if options.positions_only else None,
            options.rate_limits,
        )

    def __call__(self) -> EntryFetcher:
        broker = BrokerFetcher(
            self.service_url,
            dict(self.client_options),
            self.settings,
            self.reader,
            limiter=limiter_for(self.rate_limits),
        )
        if self.spool_dir is None:
            return broker
        from streamoffload.streaming.handoff.spool import SpoolFetcher

        return SpoolFetcher(self.spool_dir, broker)


def fetch(fetcher: EntryFetcher, topic: str, refs: Sequence[Entry], after: Position = (-1, -1)) -> list[Buffer]:
    """The checked bytes of ``refs`` in one read ``(after, last]`` (one part, or a test's entries)."""
    if not refs:
        return []
    return match(topic, refs, fetcher.stream(topic, after, refs[-1].position), fetcher.source)
