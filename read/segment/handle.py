"""The read handle of one offload segment (Pulsar's ``BlobStoreBackedReadHandleImpl``): opens and checks
its objects, answers ``ReadHandle``-like queries, and walks its blocks for sequential and single-entry
reads. What it returns is in ``results``; how bytes are fetched in ``chunked_object``, ``scan_plan``,
``prefetch`` and ``scan``; what the walk learns in ``offsets``; the rules objects are checked against in
``checks``."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from streamoffload.checkpoints.keyring import KeyRing, SegmentCipher, encryption_key_id, segment_cipher
from streamoffload.codecs.blocks import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER,
    ENTRY_HEADER_LENGTH,
    PADDING_PATTERN,
    PADDING_WORD,
    BlockHeader,
    FormatVersion,
    InvalidFieldError,
    OrderingError,
    first_non_padding,
)
from streamoffload.codecs.checksums import BlockChecksums, RecordedChecksums, recorded_checksums
from streamoffload.codecs.entry import crc32c
from streamoffload.codecs.errors import BadMagicError, ChecksumError, FormatError, LengthMismatchError, TruncatedError
from streamoffload.codecs.index import BlockLocation, OffloadIndex, is_v1_index
from streamoffload.codecs.metadata import parse_ledger_metadata_v1
from streamoffload.codecs.positions import MAX_ID, Position
from streamoffload.read.segment.cache import ChunkCache
from streamoffload.read.segment.checks import (
    check_entry_checksum,
    index_length_problem,
    index_read_length,
    index_size_problem,
    manifest_disagreements,
    position_text,
    unsupported_format_version,
)
from streamoffload.read.segment.chunked_object import DEFAULT_READ_BUFFER_SIZE, ChunkedObject, SegmentReadStats
from streamoffload.read.segment.errors import (
    EntryNotFoundError,
    ManifestMismatchError,
    MissingObjectError,
    ReadError,
    UnsupportedFormatVersionError,
)
from streamoffload.read.segment.offsets import LearnedOffsets
from streamoffload.read.segment.prefetch import ParallelPrefetcher, Prefetcher
from streamoffload.read.segment.results import OffloadedEntry, SegmentKeys
from streamoffload.read.segment.runs import EntryRun, JoinedEntries, entry_run, run_crcs_match
from streamoffload.read.segment.scan import ChunkScan, SequentialStream
from streamoffload.read.segment.scan_plan import RangePlanner
from streamoffload.read.segment.stored_block_reader import StoredBlockReader, stored_layout
from streamoffload.storage.base import ObjectInfo, ObjectNotFoundError, ObjectStore, RangedReader
from streamoffload.storage.keys import (
    FORMAT_VERSION_METADATA_KEY,
    SUPPORTED_FORMAT_VERSION,
    block_checksums_key,
    ledger_id_in_key,
)

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

DEFAULT_READAHEAD_CHUNKS = 4
CHECKSUM_CACHE_ENTRIES = 1 << 20
"""Recorded entry checksums a handle keeps (4 bytes each): the records of the blocks it read last."""


class SegmentReadHandle:
    """Reads one offload segment: a data object and its index object (v1 or v2).

    ``SegmentReadHandle.open(store, segment)`` opens one (Pulsar's ``BlobStoreBackedReadHandleImpl.open``):
    ``segment`` is a ``SegmentManifest`` (its ``dataKey``/``indexKey``, format version and positions are
    used and checked) or a ``SegmentKeys``. Opening reads the index object and HEADs both objects (their
    sizes and format-version metadata are checked; ``check_metadata=False`` skips the HEADs). The
    constructor takes what ``open`` read and checked, and does no I/O.

    ``read_buffer_size`` is the chunk (ranged GET) size; ``readahead_bytes`` bounds what the read-ahead
    thread fetches beyond what the reader consumed (default 4 chunks). ``readahead`` None (auto) runs the
    thread where the store's ranged reader says one pays off (``RangedReader.readahead``: not through a
    filesystem store's held descriptor, which the kernel already reads ahead). Sequential reads look the
    ``cache`` up but do not fill it (a catch-up scan would only evict what random reads use); single-entry
    reads fill it. The data object is read through the store's ranged reader (``ObjectStore.open_ranged_reader``:
    on a filesystem store one open descriptor per handle; ``local_files=False`` asks it to hold none);
    ``close()`` releases it and stops any read-ahead.

    Sequential reads check runs of entries together (``read.segment.runs``) and walk entry by entry where a run
    stops; ``checked_runs = False`` walks every entry so, the reference the tests hold the runs to.
    """

    checked_runs = True

    def __init__(
        self,
        store: ObjectStore,
        *,
        data_key: str,
        index_key: str,
        manifest: SegmentManifest | None,
        index: OffloadIndex,
        reader: RangedReader,
        recorded: RecordedChecksums,
        cipher: SegmentCipher | None,
        transformed: bool,
        read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
        cache: ChunkCache | None = None,
        readahead: bool | None = None,
        readahead_bytes: int | None = None,
        verify_checksums: bool = True,
    ) -> None:
        self.store = store
        self.data_key, self.index_key = data_key, index_key
        self.manifest = manifest
        self.index = index
        self.version: FormatVersion = index.version
        self.length = index.data_object_length
        self._blocks = index.blocks()
        # What was recorded at offload (codecs.checksums): nothing for objects named without a manifest, or
        # a segment sealed before records were written; then entries are checked by their own 0x0e01 CRC.
        self.recorded = recorded
        self._sums: OrderedDict[int, BlockChecksums] = OrderedDict()  # by block index, most recent last
        self._sums_entries = 0
        # Encryption at rest (checkpoints.keyring): the index describes the plaintext; each stored block is
        # longer by the cipher's overhead.
        self.encryption_key_id = encryption_key_id(manifest) if manifest is not None else None
        self.cipher = cipher
        self.transformed = transformed
        """Whether the data object's bytes are not the plaintext's (encrypted or compressed at rest)."""
        self.read_buffer_size = read_buffer_size
        self.verify_checksums = verify_checksums
        self.readahead_bytes = (
            readahead_bytes if readahead_bytes is not None else DEFAULT_READAHEAD_CHUNKS * read_buffer_size
        )
        self.cache = cache
        self.stats = SegmentReadStats()
        # One learned entry per ~1/8 read buffer: entries that size or larger are read back exactly, others
        # from at most 1/8 buffer before them; about 1 MB of offsets per GiB of data read, per open handle.
        self._learn_spacing = max(read_buffer_size // 8, 1)
        self._learned: dict[int, LearnedOffsets] = {}  # by block offset
        self._prefetchers: set[Prefetcher | ParallelPrefetcher] = set()
        self._closed = False
        self._block_offsets = [b.offset for b in self._blocks]
        self._block_positions = [(b.ledger_id, b.first_entry_id) for b in self._blocks]
        # Auto: a thread where the reader says one pays off (remote stores). A local file read through one
        # descriptor gets the kernel's own read-ahead, and a Python thread would only add hand-over costs
        # (see bench/README.md).
        self.readahead = reader.readahead if readahead is None else readahead
        self._chunks = ChunkedObject(reader, self.length, read_buffer_size, cache, self.stats)

    # -- opening ---------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        store: ObjectStore,
        segment: SegmentManifest | SegmentKeys,
        *,
        read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
        cache: ChunkCache | None = None,
        readahead: bool | None = None,
        readahead_bytes: int | None = None,
        check_metadata: bool = True,
        local_files: bool = True,
        verify_checksums: bool = True,
        keyring: KeyRing | None = None,
    ) -> SegmentReadHandle:
        """Open ``segment`` in ``store``: read its index, HEAD its objects (unless ``check_metadata`` is
        False), check them against each other and the manifest, and open the data object's ranged reader.
        Without the key of an encrypted segment this raises KeyUnavailableError naming its id."""
        if read_buffer_size < BLOCK_HEADER_LENGTH:
            raise ValueError(f"read buffer size {read_buffer_size} is smaller than a block header")
        manifest, data_key, index_key, ledger_hint, recorded = _named_objects(segment)
        data_info = _head(store, data_key, "data", index_key) if check_metadata else None
        index_bytes = _get_index(store, manifest, index_key, data_key, check_metadata=check_metadata)
        index_crc = recorded.index_crc if verify_checksums else None
        index = _decode_index(index_bytes, ledger_hint, index_crc, index_key=index_key, data_key=data_key)
        cipher = segment_cipher(manifest, keyring, where=data_key) if manifest is not None else None
        # Compression at rest (codecs.block_frames): the manifest's frame table says where each block is stored.
        try:
            layout = stored_layout(manifest, index.blocks())
        except FormatError as err:
            raise ManifestMismatchError(f"segment manifest of {data_key}: {err.reason}", where=data_key) from None
        if data_info is not None:
            stored = layout.size if layout is not None else index.data_object_length
            _check_stored_size(data_info, stored, data_key=data_key, index_key=index_key)
        if manifest is not None:
            _check_manifest(manifest, index, data_key=data_key, index_key=index_key)
        reader = store.open_ranged_reader(data_key, hold_open=local_files)
        if layout is not None:
            reader = StoredBlockReader(reader, layout.blocks, cipher, layout.block_size)
        return cls(
            store,
            data_key=data_key,
            index_key=index_key,
            manifest=manifest,
            index=index,
            reader=reader,
            recorded=recorded,
            cipher=cipher,
            transformed=layout is not None,
            read_buffer_size=read_buffer_size,
            cache=cache,
            readahead=readahead,
            readahead_bytes=readahead_bytes,
            verify_checksums=verify_checksums,
        )

    def _block_sums(self, bi: int) -> BlockChecksums | None:
        """The recorded checksums of block ``bi`` (index into the blocks in object order), read once and kept
        in a small LRU; None when the segment recorded none (or checks are off)."""
        if not (self.recorded.blocks and self.verify_checksums):
            return None
        sums = self._sums.get(bi)
        if sums is not None:
            self._sums.move_to_end(bi)
            return sums
        loc = self._blocks[bi]
        key = block_checksums_key(self.data_key, bi + 1)
        try:
            raw = self.store.get(key)
        except ObjectNotFoundError:
            raise MissingObjectError(
                f"checksum record {key} of block {bi + 1} (offset {loc.offset}) of {self.data_key} is missing from "
                f"{self.store.url}: its manifest says every block has one",
                key,
            ) from None
        sums = BlockChecksums.decode(raw, where=key)
        if (sums.offset, sums.ledger_id, sums.first_entry_id) != (loc.offset, loc.ledger_id, loc.first_entry_id):
            raise ChecksumError(
                f"checksum record is of the block of ledger {sums.ledger_id} from entry {sums.first_entry_id} at "
                f"offset {sums.offset}, but block {bi + 1} of {self.data_key} is ledger {loc.ledger_id} from entry "
                f"{loc.first_entry_id} at offset {loc.offset}",
                offset=12,
                where=key,
            )
        self._sums[bi] = sums
        self._sums_entries += sums.count
        while self._sums_entries > CHECKSUM_CACHE_ENTRIES and len(self._sums) > 1:
            self._sums_entries -= self._sums.popitem(last=False)[1].count
        return sums

    def _check_recorded(self, sums: BlockChecksums, bi: int, payload: memoryview, at: int, entry_id: int) -> None:
        """``payload`` (entry ``entry_id`` of block ``bi``, at offset ``at``) against its recorded CRC-32C."""
        sums.check(entry_id, payload, at=at, record=block_checksums_key(self.data_key, bi + 1), where=self.data_key)

    # -- Pulsar ReadHandle-like queries ----------------------------------------------------------------

    @property
    def ledger_ids(self) -> list[int]:
        return self.index.ledger_ids

    @property
    def first_position(self) -> Position:
        first = self._blocks[0]
        return (first.ledger_id, first.first_entry_id)

    @property
    def last_position(self) -> Position:
        last = self.ledger_ids[-1]
        return (last, self.last_add_confirmed(last))

    def read_plain(self, offset: int, length: int) -> bytes:
        """Plaintext bytes of the data object at ``offset`` (decrypted and decompressed when stored so), no
        checks: for hints such as a block's first publish time; entries are read, and checked, by ``read``."""
        return self._chunks.read_range(offset, max(0, min(length, self.length - offset)))

    def get_length(self) -> int:
        """Bytes of the data object (Pulsar ``getLength``)."""
        return self.length

    def last_add_confirmed(self, ledger_id: int | None = None) -> int:
        """The last entry id of ``ledger_id`` in this segment (default: the segment's only/last ledger).

        From the manifest when there is one, from a v1 index's ledger metadata, else by reading the
        ledger's last block (once; remembered)."""
        lid = self._ledger(ledger_id, default_last=True)
        manifest = self.manifest
        if manifest is not None:
            if lid == manifest.endLedgerId:
                return manifest.endEntryId
            for info in manifest.ledgers:
                if info.ledgerId == lid:
                    ends = [s.endEntryId for s in info.offloadContext.offloadSegment if s.HasField("endEntryId")]
                    if ends:
                        return max(ends)
        if self.version is FormatVersion.V1:
            meta = parse_ledger_metadata_v1(self.index.ledger(lid).metadata, where=self.index_key)
            if meta.HasField("lastEntryId") and meta.lastEntryId >= 0:
                return meta.lastEntryId
        last_block = [b for b in self._blocks if b.ledger_id == lid][-1]
        marks = self._learned.get(last_block.offset)
        if marks is None or marks.last_entry_id is None:
            for _ in self._walk(last_block, None, (lid, MAX_ID), ChunkScan(self._chunks), emit=False):
                pass
            marks = self._learned[last_block.offset]
        assert marks.last_entry_id is not None
        return marks.last_entry_id

    def _ledger(self, ledger_id: int | None, *, default_last: bool = False) -> int:
        ids = self.ledger_ids
        if ledger_id is None:
            if len(ids) == 1 or default_last:
                return ids[-1]
            raise ValueError(f"segment {self.data_key} holds ledgers {ids}: say which one")
        if ledger_id not in ids:
            raise EntryNotFoundError(f"ledger {ledger_id} is not in segment {self.data_key} (it holds {ids})")
        return ledger_id

    # -- reading ----------------------------------------------------------------------------------------

    def read(self, first_entry: int, last_entry: int, ledger_id: int | None = None) -> list[OffloadedEntry]:
        """Entries ``first_entry..last_entry`` (inclusive) of one ledger, all of them or an error (Pulsar
        ``readAsync``). ``ledger_id`` may be left out for a segment of one ledger."""
        lid = self._ledger(ledger_id)
        if first_entry < 0 or first_entry > last_entry:
            raise ValueError(f"invalid entry range {first_entry}..{last_entry}")
        out = list(self.read_range((lid, first_entry), (lid, last_entry)))
        want = last_entry - first_entry + 1
        if len(out) != want or (out and (out[0].entry_id, out[-1].entry_id) != (first_entry, last_entry)):
            got = f"{len(out)} entries" + (f" ({out[0].entry_id}..{out[-1].entry_id})" if out else "")
            raise EntryNotFoundError(
                f"ledger {lid} entries {first_entry}..{last_entry} are not all in segment {self.data_key}: found {got}"
            )
        return out

    def read_entry(self, ledger_id: int, entry_id: int) -> OffloadedEntry:
        """One entry by position. A learned entry is read with one exact ranged GET (or from cached chunks);
        any other is found by walking from the nearest learned offset (or its block's head) through cached,
        aligned chunks: a chunk or two once the handle has read nearby."""
        if self._closed:
            raise ReadError(f"read handle of {self.data_key} is closed")
        i = bisect.bisect_right(self._block_positions, (ledger_id, entry_id)) - 1
        if i >= 0 and self._blocks[i].ledger_id == ledger_id:
            marks = self._learned.get(self._blocks[i].offset)
            known = marks.exact(entry_id) if marks is not None else None
            if known is not None:
                start, length = known[0] + ENTRY_HEADER_LENGTH, known[1]
                self.stats.entries += 1
                if self._chunks.all_cached(start, length):
                    payload = ChunkScan(self._chunks).read(start, length)
                else:
                    payload = memoryview(self._chunks.read_range(start, length))
                if self.verify_checksums:
                    sums = self._block_sums(i)
                    if sums is not None:
                        self._check_recorded(sums, i, payload, start, entry_id)
                    else:
                        check_entry_checksum(payload, self.data_key, start, ledger_id, entry_id)
                return OffloadedEntry(ledger_id, entry_id, payload)
        for entry in self._read((ledger_id, entry_id), (ledger_id, entry_id), sequential=False):
            return entry
        raise EntryNotFoundError(f"entry {ledger_id}:{entry_id} is not in segment {self.data_key}")

    def read_range(self, start: Position | None = None, end: Position | None = None) -> Iterator[OffloadedEntry]:
        """Every entry with a position in ``[start, end]`` (inclusive; None = from the first / to the last),
        in position order, as one sequential stream with read-ahead. Close the iterator (or exhaust it)
        to stop the read-ahead thread; abandoning it does so too, once it is garbage collected."""
        return self._read(start, end, sequential=True)

    def read_into(self, into: JoinedEntries, start: Position | None = None, end: Position | None = None) -> int:
        """:meth:`read_range`'s entries, with the same checks, appended to ``into`` as columns (no object per
        entry: what a reader that decodes them together wants); how many."""
        before = len(into)
        for _ in self._read(start, end, sequential=True, into=into):
            pass
        return len(into) - before

    def _read(
        self, start: Position | None, end: Position | None, *, sequential: bool, into: JoinedEntries | None = None
    ) -> Iterator[OffloadedEntry]:
        if self._closed:
            raise ReadError(f"read handle of {self.data_key} is closed")
        first = self._first_block(start)
        if first is None:
            return iter(())
        loc = self._blocks[first]
        return self._stream(first, loc, start, end, sequential, into)

    def _stream(
        self,
        first: int,
        loc: BlockLocation,
        start: Position | None,
        end: Position | None,
        sequential: bool,
        into: JoinedEntries | None = None,
    ) -> Iterator[OffloadedEntry]:
        if not sequential:
            yield from self._walk(loc, start, end, ChunkScan(self._chunks), emit=True, block_index=first)
            return
        begin = self._resume(loc, start)[0]
        planner_end = self._blocks[self._last_block(end)].end
        planner = RangePlanner(self._chunks, self._blocks, first, begin, planner_end, contiguous=self._chunks.remote)
        prefetch: Prefetcher | ParallelPrefetcher | None = None
        if self.readahead and self._chunks.remote:
            prefetch = ParallelPrefetcher(self._chunks, begin, planner_end, self.readahead_bytes, self.data_key)
        elif self.readahead:
            prefetch = Prefetcher(planner.next, self.readahead_bytes, self.data_key)
        if prefetch is not None:
            self._prefetchers.add(prefetch)
            stream = SequentialStream(self._chunks, prefetch.get, threaded=True)
        elif self._chunks.remote:
            stream = SequentialStream(self._chunks, planner.next)
        else:
            stream = SequentialStream(self._chunks, None, limit=planner_end)
        try:
            yield from self._walk(loc, start, end, stream, emit=True, block_index=first, into=into)
        finally:
            if prefetch is not None:
                prefetch.close()
                self._prefetchers.discard(prefetch)

    def _first_block(self, start: Position | None) -> int | None:
        """Index (into the blocks in object order) of the first block that may hold ``start`` or a later
        position."""
        if start is None:
            return 0
        i = bisect.bisect_right(self._block_positions, start) - 1
        if i < 0:
            return 0
        if self._blocks[i].ledger_id != start[0]:
            # Block i belongs to an earlier ledger: all its entries precede start.
            return i + 1 if i + 1 < len(self._blocks) else None
        return i

    def _last_block(self, end: Position | None) -> int:
        if end is None:
            return len(self._blocks) - 1
        i = bisect.bisect_right(self._block_positions, end) - 1
        return max(i, 0)

    def _resume(self, loc: BlockLocation, start: Position | None) -> tuple[int, int | None]:
        """Where to start reading ``loc`` for ``start``: (offset, entry id expected there), or the block
        head (offset, None)."""
        if start is not None and start[0] == loc.ledger_id:
            marks = self._learned.get(loc.offset)
            if marks is not None:
                best = marks.best(start[1])
                if best is not None:
                    return best[1], best[0]
        return loc.offset, None

    def _walk(
        self,
        loc: BlockLocation,
        start: Position | None,
        end: Position | None,
        scan: ChunkScan | SequentialStream,
        *,
        emit: bool,
        block_index: int | None = None,
        into: JoinedEntries | None = None,
    ) -> Iterator[OffloadedEntry]:
        """Decode blocks from ``loc`` on, yielding the entries in ``[start, end]`` (appending them to ``into``
        instead, where given); checks as it goes."""
        key = self.data_key
        blocks = self._blocks
        bi = block_index if block_index is not None else self._block_offsets.index(loc.offset)
        spacing = self._learn_spacing
        unpack = ENTRY_HEADER.unpack_from
        keep = isinstance(scan, ChunkScan)
        manifest = self.manifest
        start_pos = start if start is not None else (-1, -1)
        offset, expect = self._resume(loc, start)
        from_head = bi == 0 and offset == loc.offset and start_pos <= (loc.ledger_id, loc.first_entry_id)
        stats = self.stats
        verify = self.verify_checksums
        previous_block_last: tuple[int, int] | None = None
        first_seen: Position | None = None
        last_ledger = last_entry = -1
        cur, cur_start, cur_len = scan.cur, scan.cur_start, len(scan.cur)
        while bi < len(blocks):
            loc = blocks[bi]
            ledger = loc.ledger_id
            if end is not None and (ledger, loc.first_entry_id) > end:
                return
            # Entry-id bounds of [start, end] within this block's ledger: plain int compares per entry.
            lo = -1 if start is None or start[0] < ledger else (start[1] if start[0] == ledger else MAX_ID + 1)
            hi = MAX_ID if end is None or end[0] > ledger else end[1]
            marks = self._learned.get(loc.offset)
            if marks is None:
                marks = self._learned[loc.offset] = LearnedOffsets()
            sums = self._block_sums(bi) if emit else None
            if offset == loc.offset:
                self._check_header(scan.read(loc.offset, BLOCK_HEADER_LENGTH), loc)
                cur, cur_start, cur_len = scan.cur, scan.cur_start, len(scan.cur)
                pos = loc.offset + BLOCK_HEADER_LENGTH
                expect = loc.first_entry_id
                if (
                    previous_block_last is not None
                    and previous_block_last[0] == ledger
                    and loc.first_entry_id <= previous_block_last[1]
                ):
                    raise OrderingError(
                        f"block of ledger {ledger} starts at entry {loc.first_entry_id}, but the previous block "
                        f"ended at entry {previous_block_last[1]}",
                        offset=loc.offset + 20,
                        where=key,
                    )
            else:
                pos = offset
            block_end = loc.end
            previous = -1 if expect is None else expect - 1
            last_mark = -spacing
            fast = emit and not keep and self.checked_runs  # runs of entries checked together, till one fails
            while True:
                rel = pos - cur_start
                if fast and rel >= 0:
                    run = entry_run(cur, rel, min(block_end - cur_start, cur_len), previous, hi)
                    ids = run.ids
                    if ids and (expect is None or ids[0] == expect):
                        n = len(ids)
                        k_hi = n if ids[-1] <= hi else n - 1  # only a run's last entry can be past ``hi``
                        k_lo = 0 if ids[0] >= lo else bisect.bisect_left(ids, lo, 0, k_hi)
                        if not self._run_checked(run, cur, cur_start, sums, verify, ledger, k_lo, k_hi):
                            fast = False  # the entry-by-entry walk below names what is wrong
                        else:
                            expect = None
                            heads, lengths = run.heads, run.lengths
                            k = 0
                            while True:  # the offsets the entry-by-entry walk learns: one per ``spacing``
                                k = bisect.bisect_left(heads, last_mark - cur_start + spacing, k)
                                if k >= n:
                                    break
                                last_mark = cur_start + heads[k]
                                marks.learn(ids[k], last_mark, lengths[k], spacing)
                                k += 1
                            if k_lo < k_hi:
                                if first_seen is None:
                                    first_seen = (ledger, ids[k_lo])
                                last_ledger, last_entry = ledger, ids[k_hi - 1]
                                stats.entries += k_hi - k_lo
                                if into is not None:
                                    into.add_run(ledger, cur, run, k_lo, k_hi)
                                else:
                                    h = ENTRY_HEADER_LENGTH
                                    yield from [
                                        OffloadedEntry(ledger, ids[k], cur[heads[k] + h : heads[k] + h + lengths[k]])
                                        for k in range(k_lo, k_hi)
                                    ]
                            if k_hi < n:
                                return
                            previous = ids[-1]
                            pos = cur_start + run.end
                            continue
                remaining = block_end - pos
                if remaining < ENTRY_HEADER_LENGTH:
                    if remaining:
                        self._check_padding(scan.read(pos, remaining), pos)
                    break
                rel = pos - cur_start
                if 0 <= rel <= cur_len - ENTRY_HEADER_LENGTH:
                    length, entry_id = unpack(cur, rel)
                else:
                    length, entry_id = unpack(scan.read(pos, ENTRY_HEADER_LENGTH), 0)
                    cur, cur_start, cur_len = scan.cur, scan.cur_start, len(scan.cur)
                if length == PADDING_WORD:
                    self._check_padding(scan.read(pos, min(remaining, ENTRY_HEADER_LENGTH)), pos)
                    break
                if length > remaining - ENTRY_HEADER_LENGTH:
                    raise LengthMismatchError(
                        f"entry header declares {length} payload bytes but only {remaining - ENTRY_HEADER_LENGTH} "
                        f"remain before the end of its block (block at offset {loc.offset}, ending at {block_end})",
                        offset=pos,
                        where=key,
                    )
                if entry_id <= previous or entry_id > MAX_ID:
                    if entry_id > MAX_ID:
                        raise InvalidFieldError(
                            f"entry id {entry_id} is negative as a Java long", offset=pos + 4, where=key
                        )
                    raise OrderingError(
                        f"entry id {entry_id} of ledger {ledger} does not follow entry id {previous} (ids must "
                        "strictly increase)",
                        offset=pos + 4,
                        where=key,
                    )
                if expect is not None:
                    if entry_id != expect:
                        what = "the block header's first entry id" if pos == loc.offset + 128 else "a learned offset"
                        raise LengthMismatchError(
                            f"entry id {entry_id} where {what} says entry {expect} starts",
                            offset=pos + 4,
                            where=key,
                        )
                    expect = None
                previous = entry_id
                if pos - last_mark >= spacing:
                    marks.learn(entry_id, pos, length, spacing)
                    last_mark = pos
                if entry_id > hi:
                    return
                if entry_id >= lo:
                    if first_seen is None:
                        first_seen = (ledger, entry_id)
                    last_ledger, last_entry = ledger, entry_id
                    if emit:
                        stats.entries += 1
                        rel = pos + ENTRY_HEADER_LENGTH - cur_start
                        if 0 <= rel <= cur_len - length:
                            payload = cur[rel : rel + length]
                        else:
                            payload = scan.read(pos + ENTRY_HEADER_LENGTH, length)
                            cur, cur_start, cur_len = scan.cur, scan.cur_start, len(scan.cur)
                        if keep:
                            scan.keep(pos + ENTRY_HEADER_LENGTH, length)
                        if sums is not None:
                            want = sums.crc_of(entry_id)
                            if want is None or crc32c(payload) != want:
                                self._check_recorded(sums, bi, payload, pos + ENTRY_HEADER_LENGTH, entry_id)
                        elif verify:
                            check_entry_checksum(payload, key, pos + ENTRY_HEADER_LENGTH, ledger, entry_id)
                        if into is not None:
                            into.add(ledger, entry_id, payload)
                        else:
                            yield OffloadedEntry(ledger, entry_id, payload)
                pos += ENTRY_HEADER_LENGTH + length
            if expect is not None:
                raise LengthMismatchError(
                    f"block holds no entries (entry {expect} expected)"
                    if pos == loc.offset + BLOCK_HEADER_LENGTH
                    else f"no entry where a learned offset says entry {expect} starts",
                    offset=pos,
                    where=key,
                )
            if sums is not None and previous != sums.last_entry_id:
                # The last entry's id is pinned by nothing else when the next block is another ledger's.
                raise ChecksumError(
                    f"block of ledger {ledger} ends with entry {previous}, but its checksum record "
                    f"{block_checksums_key(key, bi + 1)} ends with entry {sums.last_entry_id}",
                    offset=pos,
                    where=key,
                )
            marks.last_entry_id = previous
            previous_block_last = (ledger, previous)
            bi += 1
            if bi < len(blocks):
                offset = blocks[bi].offset
                expect = None
        # The walk reached the end of the data object: it must end where the manifest says.
        if manifest is not None and (end is None or end >= (manifest.endLedgerId, manifest.endEntryId)):
            last_seen = (last_ledger, last_entry) if last_entry >= 0 else None
            self._check_manifest_positions(manifest, first_seen if from_head else None, last_seen)

    def _run_checked(
        self,
        run: EntryRun,
        buf: memoryview,
        base: int,
        sums: BlockChecksums | None,
        verify: bool,
        ledger_id: int,
        lo: int,
        hi: int,
    ) -> bool:
        """Whether the entries ``lo`` to ``hi`` (exclusive) of ``run`` (in ``buf``, which starts at offset ``base``)
        pass the checks the entry-by-entry walk makes of an entry it yields: its recorded CRC-32C, else (with
        ``verify``) the entry's own."""
        if sums is not None:
            return run_crcs_match(run, buf, sums, lo, hi)
        if verify:
            try:
                for k in range(lo, hi):
                    at = base + run.heads[k] + ENTRY_HEADER_LENGTH
                    check_entry_checksum(run.payload(buf, k), self.data_key, at, ledger_id, run.ids[k])
            except FormatError:
                return False
        return True

    def _check_header(self, raw: memoryview, loc: BlockLocation) -> None:
        header = BlockHeader.decode(raw, where=self.data_key, base_offset=loc.offset)
        problems = []
        if header.version is not self.version:
            problems.append(f"{header.version.label} block in an object whose index is {self.version.label}")
        if header.block_length != loc.length:
            problems.append(f"block length {header.block_length}, the index says {loc.length}")
        if header.first_entry_id != loc.first_entry_id:
            problems.append(f"first entry id {header.first_entry_id}, the index says {loc.first_entry_id}")
        if header.ledger_id is not None and header.ledger_id != loc.ledger_id:
            problems.append(f"ledger id {header.ledger_id}, the index says {loc.ledger_id}")
        if problems:
            cls = BadMagicError if header.version is not self.version else LengthMismatchError
            raise cls(
                f"block header disagrees with the index {self.index_key}: " + "; ".join(problems),
                offset=loc.offset,
                where=self.data_key,
            )

    def _check_padding(self, raw: memoryview, at: int) -> None:
        bad = first_non_padding(raw, 0, len(raw))
        if bad is not None:
            raise LengthMismatchError(
                f"neither an entry header nor block padding: byte 0x{raw[bad]:02X} where padding has "
                f"0x{PADDING_PATTERN[bad % 4]:02X}",
                offset=at + bad,
                where=self.data_key,
            )

    def _check_manifest_positions(
        self, manifest: SegmentManifest, first_seen: Position | None, last_seen: Position | None
    ) -> None:
        for field, said, found in manifest_disagreements(manifest, first=first_seen, last=last_seen):
            if field == "start":
                raise ManifestMismatchError(
                    f"manifest says the segment starts at {position_text(said)}, the data object starts with entry "
                    f"{position_text(found)}",
                    offset=0,
                    where=self.data_key,
                )
            raise ManifestMismatchError(
                f"manifest says the segment ends at {position_text(said)}, the data object ends with entry "
                f"{position_text(found)}",
                offset=self.length,
                where=self.data_key,
            )

    # -- lifecycle --------------------------------------------------------------------------------------

    @property
    def readahead_threads(self) -> int:
        """Read-ahead threads still running for this handle (0 once every read is finished or closed)."""
        return sum(1 for p in self._prefetchers if p.alive)

    def close(self) -> None:
        """Stop any read-ahead still running; the handle cannot read afterwards."""
        self._closed = True
        for prefetch in list(self._prefetchers):
            prefetch.close()
        self._prefetchers.clear()
        self._chunks.close()

    def __enter__(self) -> SegmentReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SegmentReadHandle({self.data_key!r}, {self.version.label}, ledgers={self.ledger_ids})"


# -- opening: the I/O and checks of ``SegmentReadHandle.open`` ------------------------------------------


def _named_objects(
    segment: SegmentManifest | SegmentKeys,
) -> tuple[SegmentManifest | None, str, str, int | None, RecordedChecksums]:
    """What ``segment`` names: (its manifest or None, data key, index key, the ledger id a v1 index needs,
    the checksums its manifest says were recorded)."""
    if isinstance(segment, SegmentKeys):
        ledger_hint = segment.ledger_id
        if ledger_hint is None:
            ledger_hint = ledger_id_in_key(segment.data_key)
        return None, segment.data_key, segment.index_key, ledger_hint, RecordedChecksums(False, None)
    if not segment.dataKey or not segment.indexKey:
        raise ManifestMismatchError(
            f"segment manifest of {segment.topic} starting at {segment.startLedgerId}:{segment.startEntryId} "
            "names no data or index object",
            where=segment.topic,
        )
    ledger_hint = segment.startLedgerId if segment.formatVersion == 1 else None
    try:
        recorded = recorded_checksums([(p.key, p.value) for p in segment.driverMetadata.properties])
    except FormatError as err:
        raise ManifestMismatchError(
            f"segment manifest of {segment.topic}: {err.reason}", where=segment.dataKey
        ) from None
    return segment, segment.dataKey, segment.indexKey, ledger_hint, recorded


def _head(store: ObjectStore, key: str, what: str, other: str) -> ObjectInfo:
    """HEAD the ``what`` ("data" or "index") object ``key`` (``other`` is its partner) and check its format
    metadata."""
    try:
        info = store.head(key)
    except ObjectNotFoundError:
        raise MissingObjectError(
            f"{what} object {key} is missing from {store.url} (the {'index' if what == 'data' else 'data'}"
            f" object is {other}; never completely written, or deleted?)",
            key,
        ) from None
    _check_format_metadata(info)
    return info


def _check_format_metadata(info: ObjectInfo) -> None:
    version = unsupported_format_version(info)
    if version is not None:
        raise UnsupportedFormatVersionError(
            f"object metadata {FORMAT_VERSION_METADATA_KEY}={version!r}; this reader reads format version "
            f"{SUPPORTED_FORMAT_VERSION} (the one Pulsar's offloader writes)",
            where=info.key,
        )


def _get_index(
    store: ObjectStore, manifest: SegmentManifest | None, index_key: str, data_key: str, *, check_metadata: bool
) -> bytes:
    """The index object, read no further than its manifest's ``indexLength`` (or the cap) and refused, naming
    it, when its length is not that. With ``check_metadata`` its HEAD comes first: a size other than the
    manifest's (or above the cap) is refused before any of it is read, and no more than its size is asked."""
    want = index_read_length(manifest, index_key)
    try:
        if check_metadata:
            info = store.head(index_key)
            _check_format_metadata(info)
            problem = index_size_problem(manifest, info.size)
            if problem is not None:
                raise ManifestMismatchError(problem, where=index_key)
            want = min(want, info.size + 1)  # and one more: one that grew since is told from one of that size
        buf = store.get_range(index_key, 0, want)
    except ObjectNotFoundError:
        raise MissingObjectError(
            f"index object {index_key} of data object {data_key} is missing from {store.url} "
            "(the segment was never sealed, or was deleted)",
            index_key,
        ) from None
    problem = index_length_problem(manifest, len(buf))
    if problem is not None:
        raise ManifestMismatchError(problem, offset=len(buf), where=index_key)
    return buf


def _decode_index(
    buf: bytes, ledger_hint: int | None, index_crc: int | None, *, index_key: str, data_key: str
) -> OffloadIndex:
    """The index in ``buf``, checked against ``index_crc`` (its manifest's record; None: no check)."""
    if is_v1_index(buf) and ledger_hint is None:
        raise ReadError(
            f"{index_key} is a v1 (ledger-based) index, which does not record its ledger id, and the data key "
            f"{data_key} does not end in -ledger-<id>: give the ledger id"
        )
    # decode() reports a bad magic, truncation or inconsistency with its offset.
    index = OffloadIndex.decode(buf, ledger_id=ledger_hint, where=index_key)
    # A flip that still decodes (an offset, a LedgerInfo field) is caught by the CRC its manifest recorded.
    if index_crc is not None:
        actual = crc32c(buf)
        if actual != index_crc:
            raise ChecksumError(
                f"index object CRC-32C 0x{actual:08x} does not match 0x{index_crc:08x} recorded in its manifest "
                f"(corrupt index; the damage is somewhere in its {len(buf)} bytes)",
                offset=0,
                where=index_key,
            )
    return index


def _check_stored_size(data_info: ObjectInfo, stored: int, *, data_key: str, index_key: str) -> None:
    """The data object's size (its HEAD) against ``stored``, the size its index (and frame table) says."""
    if data_info.size < stored:
        raise TruncatedError(
            f"data object has {data_info.size} bytes but its index {index_key} says {stored}",
            offset=data_info.size,
            where=data_key,
        )
    if data_info.size > stored:
        raise LengthMismatchError(
            f"data object has {data_info.size} bytes but its index {index_key} says {stored}",
            offset=stored,
            where=data_key,
        )


def _check_manifest(manifest: SegmentManifest, index: OffloadIndex, *, data_key: str, index_key: str) -> None:
    """The manifest's format version, data length and end ledgers against the index."""
    version, length = index.version, index.data_object_length
    for field, said, _ in manifest_disagreements(manifest, format_version=int(version), data_length=length):
        if field == "formatVersion":
            message = f"manifest says format version {said} but the index {index_key} is {version.label}"
        else:
            message = f"manifest says the data object has {said} bytes, its index says {length}"
        raise ManifestMismatchError(message, where=data_key)
    ledgers = set(index.ledger_ids)
    for lid in (manifest.startLedgerId, manifest.endLedgerId):
        if lid not in ledgers:
            raise ManifestMismatchError(
                f"manifest positions {manifest.startLedgerId}:{manifest.startEntryId}.."
                f"{manifest.endLedgerId}:{manifest.endEntryId} name ledger {lid}, which the index "
                f"{index_key} does not hold (it holds {sorted(ledgers)})",
                where=data_key,
            )
