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
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamoffload.codecs.entry import crc32c
from streamoffload.errors import StreamOffloadError
from streamoffload.streaming.faults import fetch_fault, with_fetch_fault
from streamoffload.streaming.part_layout import EntryRef
from streamoffload.streaming.ranges import DataLossError, Position, ReaderSettings, ReadStats

log = logging.getLogger(__name__)


class EntryChangedError(StreamOffloadError):
    """A fetched entry is not the entry the source read: another size or another CRC-32C."""


class EntryGoneError(DataLossError):
    """An entry the source read is no longer on the broker when the sink fetches it."""


class EntryFetcher(Protocol):
    def fetch(self, topic: str, refs: Sequence[EntryRef], after: Position = (-1, -1)) -> list[bytes]:
        """The bytes of ``refs`` (one topic-partition, position order), each checked by :func:`checked`;
        ``after`` is the position just before the first (a range read starts after it)."""
        ...


def checked(topic: str, ref: EntryRef, data: bytes, source: str) -> bytes:
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


def match(
    topic: str, refs: Sequence[EntryRef], delivered: Iterable[tuple[Position, bytes]], source: str
) -> list[bytes]:
    """Pick ``refs``' entries out of a position-ordered delivery, checking each; entries the delivery has and
    ``refs`` does not (a gap the source skipped with ``failOnDataLoss=false``) are passed over."""
    out: list[bytes] = []
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


def _gone(topic: str, ref: EntryRef, source: str) -> None:
    raise EntryGoneError(
        f"{topic}: entry {ref.ledger_id}:{ref.entry_id}, read by the source, is gone from {source} when the sink "
        "fetched it (the broker's retention trimmed it before it was offloaded?); keep the broker's retention "
        "longer than the offload lag, or use offload.retainUntilOffloaded"
    )


@dataclass
class FetchStats:
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    reads: int = 0


@dataclass
class BrokerFetcher:
    """Re-reads a part's exact range from the broker (the source's reader and connection settings)."""

    service_url: str
    client_options: Mapping[str, str] = field(default_factory=dict)
    settings: ReaderSettings = field(default_factory=ReaderSettings)
    reader: str = "raw"
    stats: FetchStats = field(default_factory=FetchStats)
    _client: Any = None

    def _read_range(self) -> tuple[Any, Any]:
        if self.reader == "raw":
            from streamoffload.streaming import raw_reader as rr

            if self._client is None:
                self._client = rr.RawClient(self.service_url, dict(self.client_options))
            return self._client, rr.read_range_raw
        from streamoffload.streaming import pulsar_io as pio

        return pio.shared_client(self.service_url, dict(self.client_options)), pio.read_range

    def fetch(self, topic: str, refs: Sequence[EntryRef], after: Position = (-1, -1)) -> list[bytes]:
        if not refs:
            return []
        started = time.monotonic()
        client, read_range = self._read_range()
        read_stats = ReadStats()
        delivered = (
            ((e.ledger_id, e.entry_id), e.data)
            for e in read_range(
                client,
                topic,
                after,
                refs[-1].position,
                settings=self.settings,
                end_is_known=True,
                stats=read_stats,
            )
        )
        delivered = with_fetch_fault(fetch_fault(topic), delivered)  # tests only; unset, one lookup
        out = match(topic, refs, _closing(delivered), f"the broker at {self.service_url}")
        self.stats.reads += 1
        self.stats.entries += len(out)
        self.stats.bytes += sum(len(d) for d in out)
        self.stats.seconds += time.monotonic() - started
        return out


def _closing(it: Iterator[tuple[Position, bytes]]) -> Iterator[tuple[Position, bytes]]:
    """Close the reader's generator (and its consumer) when the match stops early."""
    try:
        yield from it
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


class MemoryFetcher:
    """Entries held in memory, by topic and position (tests; offloading entries already at hand)."""

    def __init__(self, entries: Mapping[str, Mapping[Position, bytes]] | None = None) -> None:
        self.entries: dict[str, dict[Position, bytes]] = {t: dict(e) for t, e in (entries or {}).items()}

    def add(self, topic: str, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.entries.setdefault(topic, {})[(ledger_id, entry_id)] = bytes(data)

    def fetch(self, topic: str, refs: Sequence[EntryRef], after: Position = (-1, -1)) -> list[bytes]:
        held = self.entries.get(topic, {})
        return match(topic, refs, ((r.position, held[r.position]) for r in refs if r.position in held), "memory")


@dataclass(frozen=True)
class BrokerFetcherSpec:
    """How an executor makes its :class:`BrokerFetcher`: picklable, and its ``repr`` names it (``sink_for``)."""

    service_url: str
    client_options: tuple[tuple[str, str], ...] = ()
    settings: ReaderSettings = field(default_factory=ReaderSettings)
    reader: str = "raw"

    @classmethod
    def of(cls, options: Any) -> BrokerFetcherSpec:
        """The fetcher that reads as the source does (``SourceOptions``: its reader, connection and settings)."""
        return cls(options.service_url, tuple(options.client_options), options.reader_settings(), options.reader)

    def __call__(self) -> BrokerFetcher:
        return BrokerFetcher(self.service_url, dict(self.client_options), self.settings, self.reader)
