"""The segmenter: assigns the entries of one topic-partition to offload segments and cuts blocks.

Plain Python; ``streaming.segmenter.segmenter_spark`` runs it inside ``transformWithState`` with its
state in Spark's RocksDB state store, and tests call it directly with in-memory state.

It works on entry **metadata** only (position, size, CRC-32C, publish time): every decision it makes
(segments, blocks, padding, parts, the index, the manifest) depends on sizes and positions, never on
payload bytes. A ``part`` action carries the part's block layouts (``streaming.handoff.part_layout``); the sink
fetches the entries, checks them against the layouts and builds the bytes. Spark is the control plane.

Per topic-partition it keeps (PIP-76):
- the open segment (UUID, start position, blocks written so far, per-ledger spans);
- the offload buffer, only the **remainder**, as positions and sizes: at the end of each micro-batch the
  segment's pending entries go out as a part once they make the store's minimum part (the open v2 block
  ends at the batch boundary), so between batches the state describes less than one minimum part of
  entries and blocks (v1, whose blocks stay full, up to one block plus one minimum part).

It emits actions for the sink (``streaming.handoff.actions``), in order: ``OpenAction`` (write the Assigned
manifest), ``PartAction`` (upload one multipart part of the data object), ``SealAction`` (complete the data
object, write the index, commit the segment and write the Offloaded manifest), ``RequestsAction`` (manual
requests with nothing to seal), and last ``StatsAction`` (its figures).
Everything it emits is a deterministic function of its state, its input, the batch time and the policy
version in force at that time, so a replayed micro-batch reproduces the same names, part numbers and bytes.

Where a topic-partition starts is the store's business (``ResumePoint``: the position after its last
committed segment, and that segment's ordinal + 1); segment ids include the writer's lease epoch. The
policy of a segment is fixed when it opens (recorded in its manifest and state): the batch's policy only
decides new segments, and seals the open one at once when the topic is disabled or switches method.
A disabled topic is paused, never skipped: entries that still arrive are offloaded, then sealed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, FormatVersion, framed_entry_size
from streamoffload.codecs.checksums import PROP_BLOCK_CHECKSUMS, PROP_INDEX_CRC, index_checksum
from streamoffload.codecs.errors import EntryTooLargeError
from streamoffload.codecs.index import IndexEntry, LedgerIndex, OffloadIndex
from streamoffload.codecs.metadata import ledger_info_v2, ledger_metadata_v1
from streamoffload.storage import keys
from streamoffload.streaming.handoff.actions import (
    Action,
    OpenAction,
    PartAction,
    RequestsAction,
    SealAction,
    StatsAction,
)
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.part_layout import BlockLayout, encode_layouts
from streamoffload.streaming.segmenter.segmenter_model import (
    CONTROL_POLICY,
    CONTROL_SEAL,
    SEAL_DISABLED,
    SEAL_LEDGER,
    SEAL_MANUAL,
    SEAL_METHOD_SWITCH,
    SEAL_SIZE,
    SEAL_TIME,
    ControlRequest,
    OpenSegment,
    SegmenterState,
    TopicState,
)

ROLLOVER_EARLY_MAX_MS = 10_000
"""How much earlier than the job read it a segment's rollover time may start (at most half the rollover)."""


def rollover_start(first_publish_ms: int, assigned_ms: int, rollover_ms: int) -> int:
    """When a segment's rollover time starts: when its first entry was published, so an entry of a live
    topic is readable about the rollover time after it was published, not after the job's next trigger
    read it (up to a trigger interval and a micro-batch later). But at most ``min(rollover / 2, 10 s)``
    before the job read it: an old entry (a backlog, or a producer clock that runs behind) must not open
    segments that are due at once, which would cut a backlog into one segment per micro-batch."""
    if not first_publish_ms:
        return assigned_ms
    earliest = assigned_ms - min(rollover_ms // 2, ROLLOVER_EARLY_MAX_MS)
    return min(assigned_ms, max(first_publish_ms, earliest))


class Segmenter:
    """Processes one micro-batch (or one timer) of one topic-partition."""

    def __init__(
        self,
        topic: str,
        policy: OffloadPolicy,
        state: SegmenterState,
        *,
        key_prefix: str = "",
        min_part_size: int = 1,
        now_ms: int,
        epoch: int = 0,
        resume: tuple[list[int] | None, int] | None = None,
        read_wait_s: float = 0.0,
        whole_small_segments: bool = False,
        cut_every_batch: bool = False,
    ) -> None:
        """``policy`` is the batch's policy version for the topic; ``resume`` (last committed position,
        next ordinal) seeds a topic-partition the state does not know yet; ``read_wait_s``: seconds the source's
        read limits held this batch's entries back (reported in ``stats``). ``whole_small_segments`` (the
        job's way): a segment's ``open`` goes out with its first part, so a segment below one part until its
        seal is written whole (DESIGN, "Segment lifecycle", steps 1-2); without it, the ``open`` goes out at
        once, as the multipart path's tests drive it. ``cut_every_batch`` (the job on a store that takes parts
        of any size): every micro-batch ends the open v2 block, even below one part (``_flush_batch``)."""
        self.topic = topic
        self.policy = policy
        self.store = state
        self.key_prefix = key_prefix
        self.min_part_size = max(1, min_part_size)
        self.whole_small_segments = whole_small_segments
        self.cut_every_batch = cut_every_batch
        self.now_ms = now_ms
        self.epoch = epoch
        loaded = state.load()
        if loaded is None:
            last, ordinal = resume or (None, 0)
            loaded = TopicState(topic=topic, next_ordinal=ordinal, last=list(last) if last else None)
        self.state = loaded
        self.requests: list[str] = []
        self.actions: list[Action] = []
        self.batch_entries = 0
        self.batch_bytes = 0
        self.read_wait_s = read_wait_s
        self._policy_of: tuple[dict[str, Any], OffloadPolicy] | None = None
        """The open segment's policy as last built from its recorded document (``_seg_policy``)."""
        """Entries (and their bytes) this micro-batch brought: the source sizes the next one by them."""
        # Entries/blocks of this batch not yet in the state store (written once, at the end).
        self._new_block_entries: list[Entry] = []
        self._new_held: list[bytes] = []

    # -- public --------------------------------------------------------------------------------------

    def process(self, entries: Iterable[Entry], controls: Iterable[str] = ()) -> list[Action]:
        """Assign ``entries`` (any order; duplicates dropped), then apply control requests, then
        check the rollover time. Returns the actions for the sink; call ``finish`` to save state."""
        policy = self.policy
        seg = self.state.open
        if seg is not None and seg.method != policy.method:
            self.seal(SEAL_METHOD_SWITCH)
        elif seg is not None and not policy.enabled:
            self.seal(SEAL_DISABLED)
        # Entries arriving after the rollover time belong to the next segment.
        self.check_rollover()
        for entry in sorted(entries, key=lambda e: e.position):
            previous = self.state.last
            if previous is not None and entry.position <= tuple(previous):
                continue
            self.state.last = [entry.ledger_id, entry.entry_id]
            self.batch_entries += 1
            self.batch_bytes += entry.size
            self._add(entry, previous)
        self.state.method = policy.method
        requests = [ControlRequest.parse(c) for c in controls]
        if self.state.wake_ms is not None and self.now_ms >= self.state.wake_ms:
            self.state.wake_ms = None
        for wake in (r.effective_ms for r in requests if r.kind == CONTROL_POLICY and r.effective_ms):
            if wake > self.now_ms:
                self.state.wake_ms = wake if self.state.wake_ms is None else min(self.state.wake_ms, wake)
        manual = [r for r in requests if r.kind == CONTROL_SEAL]
        if manual:
            self.requests = [r.request_id for r in manual if r.request_id]
            if self.state.open is not None:
                self.seal(SEAL_MANUAL)
            elif self.requests:
                # Nothing open: the requests are done with no segment to show for them.
                self.actions.append(RequestsAction(self.topic, tuple(self.requests)))
            self.requests = []
        if not policy.enabled:
            # Paused: what was read before the pause took effect is offloaded, not held open.
            self.seal(SEAL_DISABLED)
        self.check_rollover()
        return self.actions

    def _seg_policy(self, seg: OpenSegment) -> OffloadPolicy:
        """The policy the open segment was opened under. Asked several times per entry: built once per document
        (building and checking an ``OffloadPolicy`` was half of the segmenter's time per entry)."""
        if not seg.policy:
            return self.policy
        cached = self._policy_of
        if cached is None or cached[0] is not seg.policy:
            cached = self._policy_of = (seg.policy, OffloadPolicy(**seg.policy))
        return cached[1]

    def check_rollover(self) -> None:
        deadline = self.rollover_deadline()
        if deadline is not None and self.now_ms >= deadline:
            self.seal(SEAL_TIME)

    def next_deadline(self) -> int | None:
        """When the processing-time timer must fire: the rollover deadline or a policy wake-up."""
        times = [t for t in (self.rollover_deadline(), self.state.wake_ms) if t is not None]
        return min(times) if times else None

    def rollover_deadline(self) -> int | None:
        """When the open segment must be sealed by time (for a processing-time timer), if any."""
        seg = self.state.open
        if seg is None or seg.method != "streaming":
            return None
        return (seg.rollover_from_ms or seg.assigned_ms) + self._seg_policy(seg).rollover_ms

    def buffered_bytes(self) -> int:
        seg = self.state.open
        return 0 if seg is None else seg.block_bytes + seg.held_bytes

    def stats(self) -> StatsAction:
        """Figures for the driver's metrics: buffer, open segment, last position."""
        seg = self.state.open
        last = self.state.last
        return StatsAction(
            self.topic,
            buffered_bytes=self.buffered_bytes(),
            open_segment=seg.uuid if seg else None,
            open_segment_entries=seg.entries if seg else 0,
            open_segment_bytes=(seg.data_bytes + seg.block_bytes) if seg else 0,
            open_segment_assigned_ms=seg.assigned_ms if seg else None,
            last_position=(last[0], last[1]) if last else None,
            now_ms=self.now_ms,
            batch_entries=self.batch_entries,
            batch_bytes=self.batch_bytes,
            # When this topic-partition's timer fires (rollover, policy wake-up): the job's source plans a
            # micro-batch then, because Spark runs no batch without new data (``offset_planner`` wakes).
            wake_ms=self.next_deadline(),
            read_throttled_s=self.read_wait_s,
        )

    def finish(self) -> list[Action]:
        """Persist state; returns all actions of this batch, ending with a ``stats`` action.

        Only the remainder reaches the state store: what is left of the open segment once the batch's
        bytes went out as parts (``_flush_batch``), less than one minimum part."""
        self._flush_batch()
        if self._new_block_entries:
            self.store.append_block_entries(self._new_block_entries)
            if self.state.open is not None:
                self.state.open.block_entries_stored += len(self._new_block_entries)
            self._new_block_entries = []
        if self._new_held:
            self.store.append_held_blocks(self._new_held)
            if self.state.open is not None:
                self.state.open.held_stored += len(self._new_held)
            self._new_held = []
        self.store.save(self.state)
        self.actions.append(self.stats())
        return self.actions

    def _flush_batch(self) -> None:
        """Send out the open segment's pending bytes at the end of the micro-batch, so that the state
        store keeps only a remainder smaller than one minimum part (plus nothing of a backlog).

        v2 blocks are self-describing (the header holds the block length, the index its offset), and
        Pulsar's own streaming offloader sizes blocks from its buffer, so the open block may end here, at the
        batch boundary: always with ``cut_every_batch`` (a filesystem store: held until the held blocks make a
        part, ``min_part_size``, it is one layout record in state, where an open block is a state row per entry,
        rows that made the segmenter's state writes grow with the traffic), else once the pending bytes make a
        part (on S3 a trickle's segment then stays one block, not one block and one checksum record object per
        micro-batch). If this batch already sent a part of the segment, the tail joins that part instead: any
        size is fine then.
        A v1 (ledger method) block keeps PIP-17's shape, full except a ledger's last, so its open block
        stays in state; only its complete blocks are flushed. Deterministic: a replayed batch starts
        from the same state with the same entries, so it cuts and sends the same bytes."""
        seg = self.state.open
        if seg is None or not (seg.held_bytes or seg.block_bytes):
            return
        merge = self._batch_part(seg)
        pending = seg.held_bytes + seg.block_bytes
        min_part = self._seg_policy(seg).min_part_bytes(self.min_part_size)
        below_part = pending < min_part and merge is None
        if seg.block_bytes and seg.version == FormatVersion.V2 and (self.cut_every_batch or not below_part):
            self._cut_block(padded=False)  # sends the part itself once the held blocks make one
        if below_part:
            return  # the remainder: below one part, it waits in state for the next batch
        if not seg.held_bytes:
            return
        if seg.held_bytes >= min_part or merge is None:
            self._emit_part()
            return
        held = seg.held_bytes
        i, part = merge
        # Its blocks follow the part's: same start, same first block.
        self.actions[i] = replace(part, layouts=part.layouts + self._take_held()[0], length=part.length + held)

    def _batch_part(self, seg: OpenSegment) -> tuple[int, PartAction] | None:
        """The last part of ``seg`` this batch sent, if any, and where it is in ``actions`` (its tail may join it)."""
        for i in range(len(self.actions) - 1, -1, -1):
            action = self.actions[i]
            if isinstance(action, PartAction) and action.segment == seg.uuid:
                return i, action
        return None

    # -- assigning entries ------------------------------------------------------------------------------

    def _add(self, entry: Entry, previous: list[int] | None) -> None:
        """Assign ``entry``; ``previous`` is the position the segmenter saw before it (None: none)."""
        framed = framed_entry_size(entry.size)
        seg = self.state.open
        if seg is not None:
            if seg.method == "ledger" and entry.ledger_id != seg.last[0]:
                self.seal(SEAL_LEDGER)
            elif (
                seg.method == "streaming"
                and seg.entries
                and self._size_if_added(seg, entry, framed) > self._seg_policy(seg).max_segment_bytes
            ):
                self.seal(SEAL_SIZE)
        policy = self.policy if self.state.open is None else self._seg_policy(self.state.open)
        if BLOCK_HEADER_LENGTH + framed > policy.block_size:
            raise EntryTooLargeError(
                f"{self.topic}: entry {entry.ledger_id}:{entry.entry_id} of {entry.size} bytes does not "
                f"fit in a block of managedLedgerOffloadMaxBlockSizeInBytes = {policy.block_size} "
                f"(needs {BLOCK_HEADER_LENGTH + framed}); raise it and restart: nothing was offloaded past "
                "the previous entry"
            )
        if self.state.open is None:
            self._open(entry)
        seg = self.state.open
        assert seg is not None
        if seg.block_bytes and (entry.ledger_id != seg.block_ledger or seg.block_bytes + framed > policy.block_size):
            self._cut_block(padded=entry.ledger_id == seg.block_ledger)
        if not seg.block_bytes:
            seg.block_ledger, seg.block_first_entry, seg.block_bytes = (
                entry.ledger_id,
                entry.entry_id,
                BLOCK_HEADER_LENGTH,
            )
            seg.block_after = list(previous) if previous is not None else [-1, -1]
        seg.block_bytes += framed
        self._new_block_entries.append(entry)
        span = seg.spans.setdefault(str(entry.ledger_id), [entry.entry_id, entry.entry_id, 0, 0])
        span[1] = entry.entry_id
        span[2] += 1
        span[3] += entry.size
        seg.last = [entry.ledger_id, entry.entry_id]
        seg.entries += 1
        if entry.publish_time:
            # The earliest and latest publish time, not the first and last entry's: producers' clocks
            # differ, and readers prune whole segments by this range (pulsar-offloaded, retention).
            seg.publish_first = min(seg.publish_first or entry.publish_time, entry.publish_time)
            seg.publish_last = max(seg.publish_last, entry.publish_time)

    def _size_if_added(self, seg: OpenSegment, entry: Entry, framed: int) -> int:
        """The data object's size if ``entry`` were the last entry of the segment."""
        block_size = self._seg_policy(seg).block_size
        if seg.block_bytes and entry.ledger_id == seg.block_ledger and seg.block_bytes + framed <= block_size:
            return seg.data_bytes + seg.block_bytes + framed
        # The open block is cut first: padded to the block size if full, exact at a ledger change.
        open_block = 0
        if seg.block_bytes:
            open_block = block_size if entry.ledger_id == seg.block_ledger else seg.block_bytes
        return seg.data_bytes + open_block + BLOCK_HEADER_LENGTH + framed

    def _open(self, entry: Entry) -> None:
        method = self.policy.method
        version = FormatVersion.V2 if method == "streaming" else FormatVersion.V1
        ordinal = self.state.next_ordinal
        seg_id = mf.segment_uuid(self.topic, ordinal, entry.position, self.epoch)
        policy_json = self.policy.to_json()
        ledger = entry.ledger_id if version == FormatVersion.V1 else None
        data_key = keys.data_key(self.key_prefix, self.topic, str(seg_id), ledger_id=ledger)
        index_key = keys.index_key(self.key_prefix, self.topic, str(seg_id), ledger_id=ledger)
        manifest = mf.new_manifest(
            topic=self.topic,
            segment_id=seg_id,
            ordinal=ordinal,
            format_version=int(version),
            start=entry.position,
            assigned_ms=self.now_ms,
            data_key=data_key,
            index_key=index_key,
            driver_properties={
                mf.PROP_METHOD: method,
                mf.PROP_EPOCH: str(self.epoch),
                mf.PROP_POLICY: json.dumps(policy_json, sort_keys=True, separators=(",", ":")),
            },
        )
        manifest_bytes = mf.encode_manifest(manifest)
        self.state.open = OpenSegment(
            uuid=str(seg_id),
            ordinal=ordinal,
            version=int(version),
            method=method,
            start=list(entry.position),
            last=list(entry.position),
            assigned_ms=self.now_ms,
            rollover_from_ms=rollover_start(entry.publish_time, self.now_ms, self.policy.rollover_ms),
            manifest=manifest_bytes.hex(),
            policy=policy_json,
            data_key=data_key,
            checksums=True,
            open_sent=False,
        )
        self.state.next_ordinal += 1
        if not self.whole_small_segments:
            self._send_open(self.state.open)

    def _send_open(self, seg: OpenSegment) -> None:
        """The segment's ``open`` (its Assigned manifest), once: at the open, or with ``whole_small_segments``
        right before its first part. A segment still below one part at its seal then goes out opened, written and
        sealed in one batch, which the sink writes whole (no Assigned manifest, no multipart upload); until then
        it has nothing in the store."""
        if seg.open_sent:
            return
        seg.open_sent = True
        opened = mf.decode_manifest(bytes.fromhex(seg.manifest))
        self.actions.append(
            OpenAction(
                self.topic,
                seg.uuid,
                manifest=bytes.fromhex(seg.manifest),
                data_key=opened.dataKey,
                index_key=opened.indexKey,
                ordinal=seg.ordinal,
                method=seg.method,
            )
        )

    # -- blocks and parts ----------------------------------------------------------------------------

    def _cut_block(self, *, padded: bool) -> None:
        seg = self.state.open
        assert seg is not None and seg.block_bytes
        stored = self.store.block_entries() if seg.block_entries_stored else []
        entries = stored + self._new_block_entries
        if seg.block_entries_stored:
            self.store.clear_block_entries()
        seg.block_entries_stored = 0
        self._new_block_entries = []
        layout = BlockLayout(
            seg.block_ledger,
            tuple((e.entry_id, e.size, e.crc32c) for e in entries),
            self._seg_policy(seg).block_size if padded else 0,
            (seg.block_after[0], seg.block_after[1]),
        )
        length = layout.length
        assert padded or length == seg.block_bytes, (length, seg.block_bytes)
        seg.blocks.append([seg.block_ledger, seg.block_first_entry, len(seg.blocks) + 1, seg.data_bytes])
        seg.data_bytes += length
        seg.block_bytes = 0
        seg.block_ledger = seg.block_first_entry = -1
        self._new_held.append(encode_layouts([layout]))
        seg.held_bytes += length
        if seg.held_bytes >= self._seg_policy(seg).min_part_bytes(self.min_part_size):
            self._emit_part()

    def _take_held(self) -> tuple[bytes, int]:
        """The layouts of the complete blocks not yet sent (from state and from this batch), removed from
        both, and how many blocks they are (one layout record each)."""
        seg = self.state.open
        assert seg is not None
        stored = self.store.held_blocks() if seg.held_stored else []
        if seg.held_stored:
            self.store.clear_held_blocks()
        held = stored + self._new_held
        self._new_held = []
        seg.held_stored = 0
        seg.held_bytes = 0
        return b"".join(held), len(held)

    def _emit_part(self, *, last: bool = False) -> None:
        """Send the held blocks as the open segment's next part (``last``: the seal's, which a store may take
        below its minimum part size)."""
        seg = self.state.open
        assert seg is not None
        length = seg.held_bytes
        data, count = self._take_held()
        if not data:
            return
        self._send_open(seg)
        seg.parts += 1
        self.actions.append(
            PartAction(
                self.topic,
                seg.uuid,
                part_number=seg.parts,
                layouts=data,
                data_key=seg.data_key,
                manifest_key=keys.manifest_key(self.key_prefix, self.topic, seg.start[0], seg.start[1], seg.uuid),
                format=FormatVersion(seg.version),
                length=length,
                offset=seg.data_bytes - length,  # where the part starts in the (plaintext) data object
                last=last,
                # The held blocks are the segment's last ``count``: where the part starts, and its first block's
                # ordinal, name the blocks' checksum records (the sink writes them with the part).
                first_block=len(seg.blocks) - count + 1 if seg.checksums else None,
            )
        )

    def seal(self, reason: str) -> None:
        seg = self.state.open
        if seg is None:
            return
        if seg.block_bytes:
            self._cut_block(padded=False)
        self._emit_part(last=True)
        index = self._index(seg)
        index_bytes = index.encode()
        opened = mf.decode_manifest(bytes.fromhex(seg.manifest))
        spans = [
            mf.LedgerSpan(int(ledger), first, last, count, size)
            for ledger, (first, last, count, size) in seg.spans.items()
        ]
        sealed = mf.sealed_manifest(
            opened,
            end=(seg.last[0], seg.last[1]),
            offloaded_ms=self.now_ms,
            spans=spans,
            data_length=seg.data_bytes,
            index_length=len(index_bytes),
            block_count=len(seg.blocks),
            part_count=seg.parts,
            seal_reason=reason,
            publish_time_first=seg.publish_first,
            publish_time_last=seg.publish_last,
        )
        # What readers check the segment against (codecs.checksums): the index's CRC-32C, and whether every
        # block has its entries' checksum record (not for a segment opened before they were written).
        sealed = mf.with_driver_property(sealed, PROP_INDEX_CRC, f"{index_checksum(index_bytes):08x}")
        if seg.checksums:
            sealed = mf.with_driver_property(sealed, PROP_BLOCK_CHECKSUMS, "1")
        self.actions.append(
            SealAction(
                self.topic,
                seg.uuid,
                part_count=seg.parts,
                index=index_bytes,
                manifest=mf.encode_manifest(sealed),
                data_key=opened.dataKey,
                index_key=opened.indexKey,
                reason=reason,
                data_length=seg.data_bytes,
                entries=seg.entries,
                entry_bytes=sealed.entryBytes,
                ordinal=seg.ordinal,
                end=(seg.last[0], seg.last[1]),
                format=FormatVersion(seg.version),
                epoch=self.epoch,
                requests=tuple(self.requests) if reason == SEAL_MANUAL else (),
            )
        )
        self.state.open = None
        self.state.sealed_count += 1

    def _index(self, seg: OpenSegment) -> OffloadIndex:
        per_ledger: dict[int, list[IndexEntry]] = {}
        for ledger, first_entry, part_id, offset in seg.blocks:
            per_ledger.setdefault(ledger, []).append(IndexEntry(first_entry, part_id, offset))
        ledgers = []
        for ledger in sorted(per_ledger):
            _first, last, _count, size = seg.spans[str(ledger)]
            if seg.version == FormatVersion.V1:
                metadata = ledger_metadata_v1(last_entry_id=last, length=size, ctime_ms=seg.assigned_ms)
            else:
                # Pulsar's LedgerInfo.entries counts the ledger's entries from entry 0, and its streaming
                # reader takes entries - 1 of a ledger's last index as the last entry: the last entry id + 1
                # here, not the segment's count (a ledger that began in an earlier segment would end early).
                metadata = ledger_info_v2(ledger_id=ledger, entries=last + 1, size=size, timestamp_ms=self.now_ms)
            ledgers.append(LedgerIndex(ledger, metadata, tuple(per_ledger[ledger])))
        return OffloadIndex(FormatVersion(seg.version), seg.data_bytes, tuple(ledgers))


def run_segmenter(
    topic: str,
    policy: OffloadPolicy,
    state: SegmenterState,
    entries: Iterable[Entry],
    controls: Iterable[str] = (),
    *,
    now_ms: int,
    key_prefix: str = "",
    min_part_size: int = 1,
    epoch: int = 0,
    resume: tuple[list[int] | None, int] | None = None,
    on_segmenter: Callable[[Segmenter], Any] | None = None,
    whole_small_segments: bool = False,
    cut_every_batch: bool = False,
) -> list[Action]:
    """One micro-batch for one topic-partition: process, save state, return the actions."""
    segmenter = Segmenter(
        topic,
        policy,
        state,
        key_prefix=key_prefix,
        min_part_size=min_part_size,
        now_ms=now_ms,
        epoch=epoch,
        resume=resume,
        whole_small_segments=whole_small_segments,
        cut_every_batch=cut_every_batch,
    )
    segmenter.process(entries, controls)
    actions = segmenter.finish()
    if on_segmenter is not None:
        on_segmenter(segmenter)
    return actions
