"""``startingTime`` of the live ``pulsar`` source: the first entry of a topic-partition published at or after
a time, found in the offload store (read-through) or on the broker, without reading the history.

Publish times are assumed to grow with position along a topic-partition, as Pulsar's own seek by time
assumes (producers' clocks set them; a producer whose clock runs behind can place an entry slightly out of
order, and the search may then start a little early or late around it).

* **Store:** the Offloaded manifests carry each segment's first and last publish time, so the segment is
  picked without opening any other; inside it a binary search over its blocks' first entries (one small
  read each) finds the block, which is scanned to the entry.
* **Broker:** there is no admin API here and no seek by time in the raw protocol's reader, so the search
  probes single entries (``probe_after``: a consumer opened after a position, one entry received): a binary
  search over the entry ids of the ledger that holds the time. Ledgers are walked from the broker's first
  entry; a ledger's end is found by probing (an entry after ``(L, x)`` in ledger L exists iff x < its last).
  About 2 log2(entries) probes per ledger walked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from streamoffload.codecs.entry import decode_entry
from streamoffload.codecs.positions import Position
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, Probe
from streamoffload.read.topic_reader import TopicReader

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

ProbeAfter = Callable[[Position], Probe | None]


def _publish_time(payload: bytes | memoryview, where: str) -> int:
    return decode_entry(payload, verify_checksum=False, where=where).metadata.publish_time


def stored_position_at(
    reader: TopicReader, tp: str, segments: Sequence[SegmentManifest], at_ms: int
) -> Position | None:
    """The first stored entry of ``tp`` published at or after ``at_ms`` (``segments``: its Offloaded manifests
    in position order), or None when every stored entry is older."""
    segment = next((m for m in segments if m.publishTimeLast >= at_ms), None)
    if segment is None:
        return None
    handle = reader.open_segment(segment)
    blocks = handle.index.blocks()

    def first_time(i: int) -> int:
        block = blocks[i]
        entry = next(handle.read_range((block.ledger_id, block.first_entry_id), None))
        return _publish_time(entry.payload, f"{tp} {entry.ledger_id}:{entry.entry_id}")

    lo, hi, found = 0, len(blocks) - 1, 0  # the last block whose first entry is older than at_ms
    while lo <= hi:
        mid = (lo + hi) // 2
        if first_time(mid) < at_ms:
            found, lo = mid, mid + 1
        else:
            hi = mid - 1
    start = (blocks[found].ledger_id, blocks[found].first_entry_id)
    for entry in handle.read_range(start, None):
        if _publish_time(entry.payload, f"{tp} {entry.ledger_id}:{entry.entry_id}") >= at_ms:
            return entry.position
    return None


def ledger_last(probe: ProbeAfter, first: Probe, latest: Position) -> tuple[int, Probe | None]:
    """The last entry id of the ledger ``first`` opens, and the broker's first entry after it (if seen)."""
    ledger_id = first.position[0]
    if ledger_id == latest[0]:
        return latest[1], None
    low, step = first.position[1], 1  # low: an id known to exist
    beyond: Probe | None = None
    while True:  # gallop to an id past the ledger's end
        got = probe((ledger_id, low + step - 1))
        if got is None or got.position[0] != ledger_id:
            high, beyond = low + step - 1, got
            break
        low, step = got.position[1], step * 2
    while low < high:  # the last id is in [low, high]
        mid = (low + high + 1) // 2
        got = probe((ledger_id, mid - 1))
        if got is not None and got.position[0] == ledger_id:
            low = mid
        else:
            high = mid - 1
            beyond = got if got is not None else beyond
    return low, beyond


def broker_position_at(probe: ProbeAfter, latest: Position | None, at_ms: int) -> Position | None:
    """The first entry on the broker published at or after ``at_ms``, or None when it holds nothing that
    recent. ``probe(after)`` is the broker's first entry after a position (``latest`` its latest)."""
    if latest is None:
        return None
    first = probe(BEFORE_EARLIEST)
    while first is not None:
        if first.publish_time is not None and first.publish_time >= at_ms:
            return first.position
        last_id, following = ledger_last(probe, first, latest)
        last = probe((first.position[0], last_id - 1))
        if last is not None and last.publish_time is not None and last.publish_time >= at_ms:
            lo, hi = first.position[1] + 1, last_id  # the answer is in (first, last]
            while lo < hi:
                mid = (lo + hi) // 2
                found = probe((first.position[0], mid - 1))
                if found is not None and found.publish_time is not None and found.publish_time >= at_ms:
                    hi = found.position[1]
                else:
                    lo = mid + 1
            return (first.position[0], lo)
        if first.position[0] >= latest[0]:
            return None
        first = following if following is not None else probe((first.position[0], last_id))
    return None


__all__ = ["broker_position_at", "ledger_last", "stored_position_at"]
