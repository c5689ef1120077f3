"""The offloaded ReadHandle: reads entries back from data and index objects (PIP-17 v1 and PIP-76 v2).

Modelled on Pulsar's ``ReadHandle`` (``readAsync(first, last)``, ``getLastAddConfirmed``, ``getLength``)
and its ``BlobStoreBackedReadHandleImpl``, without the mistakes SPEC 7 lists:

- **No seek per read.** Data is read with ranged GETs of ``read_buffer_size`` bytes
  (``managedLedgerOffloadReadBufferSizeInBytes``), never one per entry. A catch-up (sequential) read is
  one forward stream of ranges (``scan_plan.RangePlanner``): from a remote store, back-to-back ranges, entries that
  cross a range end joined in memory (nothing is fetched twice); from local files, ranges cut at entry
  boundaries so nothing is joined (a page-cache re-read of the unfinished entry is cheaper than a copy),
  with block padding skipped. Single-entry reads use aligned chunks, which the cache can share.
- **Read-ahead.** A sequential read from a remote store keeps up to ``readahead_bytes / read_buffer_size``
  ranged GETs in flight on worker threads (at most 8), handed to the reader in order
  (``prefetch.ParallelPrefetcher``): GETs are mostly waiting, so several at once is what makes replay fast. The
  workers stop when the read ends or is abandoned (closing or dropping the iterator) and when the handle
  closes; a GET's error surfaces in the reader where that range would have been read. From local files
  the default is no thread: the file is read through one held descriptor, which the kernel reads ahead
  itself, and a thread only added hand-over costs (``prefetch.Prefetcher`` runs the planner on one when asked).
- **Learned offsets.** While reading, a handle remembers where entries start and how long they are (one
  about every eighth of a read buffer, so memory stays proportional to the object size / read buffer
  size). A later read of a learned entry is one exact ranged GET; of another nearby entry, a walk from the
  nearest learned one instead of from the head of its (64 MiB by default) block.
- **A bounded cache** of aligned chunks (``ChunkCache``, an LRU bounded in bytes, with hit/miss counters)
  shared by every handle given it. Single-entry reads put in it the chunks they return entries from;
  sequential scans, and the chunks a walk only passes through, do not fill it (they would evict what is
  reused, and retaining them made every later allocation fault its pages in).
- **Checked as it goes.** Block headers are checked against the index (format, length, first entry id,
  ledger id), entry lengths against their block, entry ids for strict order, padding where it starts,
  and a full read of a segment against its manifest's start and end; corruption raises a
  ``FormatError`` naming the object key and the absolute byte offset. The objects' user metadata
  ``s3managedledgeroffloaderformatversion`` must be ``1`` when present, as Pulsar's readers require.
- **No entry whose checksum fails is returned.** Every entry carries Pulsar's CRC-32C (magic 0x0e01, the
  checksum of everything after it); it is checked before the entry is handed out, in every read mode
  (``verify_checksums=False`` turns this off for payloads that are not Pulsar entries, e.g. benchmarks).
  A mismatch raises ``ChecksumError`` naming the data object and the byte offset of the stored CRC.

Payloads come back as read-only ``memoryview``s into the range read (zero-copy; a single-entry read of an
entry straddling two cached chunks joins them). ``bytes(entry.payload)`` makes an owned copy.

Modules: ``handle`` (``SegmentReadHandle``), ``chunked_object`` (``ChunkedObject``: one data object read by
range, through the store's ``RangedReader``), ``scan_plan`` and ``prefetch`` (sequential reads), ``scan`` (the
two ways the walk gets bytes), ``offsets`` (``LearnedOffsets``), ``cache`` (``ChunkCache``), ``checks`` (the
rules, shared with ``verify``), ``stored_block_reader`` (the plaintext view of blocks stored compressed or
encrypted), ``describe`` (what ``inspect`` prints of local objects), ``results`` and ``errors``.

``read.topic_reader.TopicReader`` reads a topic-partition's offloaded history (several segments,
several ledgers, v1 and v2 objects side by side) in one call, finding segments through the offload
metadata: it knows manifests, so it lives in the layer that does.
"""

from streamoffload.read.segment.cache import DEFAULT_CACHE_BYTES, CacheStats, ChunkCache, shared_cache
from streamoffload.read.segment.checks import (
    ManifestDisagreement,
    check_entry_checksum,
    manifest_disagreements,
    unsupported_format_version,
)
from streamoffload.read.segment.chunked_object import DEFAULT_READ_BUFFER_SIZE, SegmentReadStats
from streamoffload.read.segment.errors import (
    EntryNotFoundError,
    ManifestMismatchError,
    MissingObjectError,
    ReadError,
    TopicNotOffloadedError,
    UnsupportedFormatVersionError,
)
from streamoffload.read.segment.handle import SegmentReadHandle
from streamoffload.read.segment.results import OffloadedEntry, SegmentKeys

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_READ_BUFFER_SIZE",
    "CacheStats",
    "ChunkCache",
    "EntryNotFoundError",
    "ManifestDisagreement",
    "ManifestMismatchError",
    "MissingObjectError",
    "OffloadedEntry",
    "ReadError",
    "SegmentKeys",
    "SegmentReadHandle",
    "SegmentReadStats",
    "TopicNotOffloadedError",
    "UnsupportedFormatVersionError",
    "check_entry_checksum",
    "manifest_disagreements",
    "shared_cache",
    "unsupported_format_version",
]
