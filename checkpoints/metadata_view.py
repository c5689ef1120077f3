"""An incremental view of the offload metadata (``MetadataView``): what a periodic pass (metrics,
retention, cleanup) costs is proportional to what changed, not to the topic's history."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.deleted_segments import DeletedRecord, DeletedSummary, DeletedTotals, all_marked
from streamoffload.checkpoints.manifest import OFFLOADED, LedgerSpan
from streamoffload.checkpoints.metadata_store import MetadataStore, delete_block_checksums, now_ms
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import DeletedLedger, SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectExistsError, ObjectInfo, ObjectNotFoundError

log = logging.getLogger(__name__)

_META = keys.META_DIR + "/"

KEEP_RECENT = 8
"""Offloaded segments per topic-partition that the job's long-lived views (retention's, the metrics') hold one
by one; older ones are folded into sums (``SegmentFold``). Small: at 10,000 topic-partitions each held record
costs ~10 MB of the driver's memory."""


@dataclass(frozen=True)
class SegmentState:
    """What a reader of metadata (metrics, status) needs of one segment, without the manifest's encoding."""

    segment_id: str
    status: str
    """Assigned, Offloaded or Failed (an unfinished attempt with a failure note is Failed)."""
    entries: int
    entry_bytes: int
    data_length: int
    """Bytes of the data object."""
    seal_reason: str
    end: Position
    publish_last_ms: int
    """Publish time of the segment's last entry (0 while it is open)."""
    assigned_ms: int

    @property
    def offloaded(self) -> bool:
        return self.status == mf.STATUS_NAMES[OFFLOADED]


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """What the view keeps of one manifest: what its passes read (retention, compaction, metrics, status).

    A decoded ``SegmentManifest`` costs about 5.4 KB of resident memory (1.85 KB serialized), and the view
    keeps one per segment the store holds; this record costs well under 1 KB. A pass that must act on the
    whole manifest (deleting the segment) reads it again (``MetadataView.apply_deletions``)."""

    key: str
    segment_id: str
    ordinal: int
    status: int
    start: Position
    end: Position
    entries: int
    entry_bytes: int
    data_length: int
    seal_reason: str
    publish_last_ms: int
    offloaded_ms: int
    assigned_ms: int
    spans: tuple[LedgerSpan, ...]

    @classmethod
    def of(cls, key: str, manifest: SegmentManifest) -> SegmentRecord:
        return cls(
            key=key,
            segment_id=str(mf.manifest_uuid(manifest)),
            ordinal=manifest.ordinal,
            status=manifest.status,
            start=mf.start_position(manifest),
            end=mf.end_position(manifest),
            entries=manifest.entries,
            entry_bytes=manifest.entryBytes,
            data_length=manifest.dataLength,
            seal_reason=sys.intern(manifest.sealReason),
            publish_last_ms=manifest.publishTimeLast,
            offloaded_ms=manifest.offloadedTimestamp,
            assigned_ms=manifest.assignedTimestamp,
            spans=tuple(mf.spans_of(manifest)),
        )

    @property
    def offloaded(self) -> bool:
        return self.status == OFFLOADED


@dataclass(slots=True)
class LedgerFold:
    """One ledger's part of some folded segments: what retention reads of it."""

    newest_ms: int = 0
    """Newest publish (or offload) time of a folded segment holding the ledger."""
    size: int = 0
    """Bytes of the ledger's entries in those segments."""
    segments: int = 0


@dataclass
class FoldGroup:
    """The folded segments that start in one ledger: their sums, and per ledger they hold what retention reads."""

    totals: DeletedTotals = field(default_factory=DeletedTotals)
    ledgers: dict[int, LedgerFold] = field(default_factory=dict)

    def add(self, record: SegmentRecord) -> None:
        self.totals.add(record.entries, record.entry_bytes, record.data_length, record.seal_reason)
        stamp = record.publish_last_ms or record.offloaded_ms
        for span in record.spans:
            ledger = self.ledgers.get(span.ledger_id)
            if ledger is None:
                ledger = self.ledgers[span.ledger_id] = LedgerFold()
            ledger.newest_ms = max(ledger.newest_ms, stamp)
            ledger.size += span.size
            ledger.segments += 1

    def remove(self, record: SegmentRecord) -> None:
        """A segment of the group was deleted (its ledgers' newest times stay: they are marked deleted by then)."""
        self.totals.remove(record.entries, record.entry_bytes, record.data_length, record.seal_reason)
        for span in record.spans:
            ledger = self.ledgers.get(span.ledger_id)
            if ledger is None:
                continue
            ledger.size -= span.size
            ledger.segments -= 1
            if ledger.segments <= 0:
                del self.ledgers[span.ledger_id]


def merged_ledgers(groups: Iterable[FoldGroup]) -> dict[int, LedgerFold]:
    """Per ledger, over ``groups``: the newest time, and the bytes and segments summed."""
    out: dict[int, LedgerFold] = {}
    for group in groups:
        for lid, part in group.ledgers.items():
            ledger = out.get(lid)
            if ledger is None:
                ledger = out[lid] = LedgerFold()
            ledger.newest_ms = max(ledger.newest_ms, part.newest_ms)
            ledger.size += part.size
            ledger.segments += part.segments
    return out


@dataclass
class SegmentFold:
    """Offloaded segments the view no longer keeps one by one (``MetadataView(keep_recent=...)``), grouped by the
    ledger they start in (the first number of a manifest key): sums and, per ledger, what retention reads. A
    long-running pass then holds per topic-partition a group per ledger plus its newest segments, not a record
    per segment ever offloaded; and a listing tells from the keys alone which groups lost segments."""

    through: str = ""
    """Every manifest key up to this one that the view does not hold is folded here."""
    groups: dict[int, FoldGroup] = field(default_factory=dict)
    """Start ledger -> its folded segments."""
    last_end: Position | None = None
    last_publish_ms: int = 0
    swept: frozenset[int] = frozenset()
    """The marked ledgers whose folded segments the last ``MetadataView._delete_folded`` went through."""

    @property
    def segments(self) -> int:
        return sum(group.totals.segments for group in self.groups.values())

    @property
    def totals(self) -> DeletedTotals:
        out = DeletedTotals()
        for group in self.groups.values():
            out.merge(group.totals)
        return out

    @property
    def ledgers(self) -> dict[int, LedgerFold]:
        return merged_ledgers(self.groups.values())

    def add(self, record: SegmentRecord) -> None:
        group = self.groups.get(record.start[0])
        if group is None:
            group = self.groups[record.start[0]] = FoldGroup()
        group.add(record)
        if self.last_end is None or record.end > self.last_end:
            self.last_end = record.end
        self.last_publish_ms = max(self.last_publish_ms, record.publish_last_ms)
        self.through = max(self.through, record.key)

    def remove(self, record: SegmentRecord) -> None:
        group = self.groups.get(record.start[0])
        if group is None:
            return
        group.remove(record)
        if group.totals.segments <= 0:
            del self.groups[record.start[0]]


@dataclass
class TopicMeta:
    """A topic-partition's metadata as one listing of its ``_meta/`` found it (objects read once, cached)."""

    topic: str
    segments: dict[str, SegmentRecord] = field(default_factory=dict)
    """Manifest key -> its record (as written: Assigned, Offloaded or Failed), in key (position) order."""
    marks: dict[int, DeletedLedger] = field(default_factory=dict)
    failures: dict[str, ObjectInfo] = field(default_factory=dict)
    """Segment uuid -> the failure note's listing (its text is not read)."""
    commits: dict[int, ObjectInfo] = field(default_factory=dict)
    deleted: dict[str, DeletedRecord] = field(default_factory=dict)
    """Segment uuid -> its deleted-segment record."""
    summaries: dict[int, DeletedSummary] = field(default_factory=dict)
    corrupt: list[str] = field(default_factory=list)
    """Keys of objects that did not decode (skipped; reported by status/verify)."""
    fold: SegmentFold = field(default_factory=SegmentFold)
    """The older Offloaded segments, as sums (``segments`` holds the rest): empty unless the view folds."""

    def offloaded(self) -> list[SegmentRecord]:
        """The readable segments not folded, in position order (the lower ordinal wins an overlap, as in
        ``MetadataStore.offloaded_segments``; a folded segment is lower than any held)."""
        out: list[SegmentRecord] = []
        last = self.fold.last_end
        for record in self.segments.values():
            if not record.offloaded:
                continue
            if last is not None and record.start <= last:
                continue
            out.append(record)
            last = record.end
        return out

    def ledgers(self) -> dict[int, LedgerFold]:
        """Per ledger, over every readable segment (folded and held): what retention reads."""
        held = FoldGroup()
        for record in self.offloaded():
            held.add(record)
        return merged_ledgers([*self.fold.groups.values(), held])

    def segment_ids(self) -> set[str]:
        return {r.segment_id for r in self.segments.values()}

    @property
    def summary(self) -> DeletedSummary | None:
        return self.summaries[max(self.summaries)] if self.summaries else None

    def status_name(self, record: SegmentRecord) -> str:
        """Assigned, Offloaded or Failed (an unfinished attempt with a failure note is Failed)."""
        if not record.offloaded and record.segment_id in self.failures:
            return mf.STATUS_NAMES[mf.FAILED]
        return mf.STATUS_NAMES[record.status]

    def segment_states(self) -> list[SegmentState]:
        """Every segment with a manifest (any status), in position order."""
        return [self._state(r) for r in self.segments.values()]

    def offloaded_states(self) -> list[SegmentState]:
        """The readable segments (``offloaded``), in position order."""
        return [self._state(r) for r in self.offloaded()]

    def _state(self, record: SegmentRecord) -> SegmentState:
        return SegmentState(
            segment_id=record.segment_id,
            status=self.status_name(record),
            entries=record.entries,
            entry_bytes=record.entry_bytes,
            data_length=record.data_length,
            seal_reason=record.seal_reason,
            end=record.end,
            publish_last_ms=record.publish_last_ms,
            assigned_ms=record.assigned_ms,
        )

    def deleted_totals(self) -> DeletedTotals:
        """Counts of every deleted segment that no manifest still shows: the summary plus the records it
        does not hold (legacy records without counts add nothing)."""
        summary = self.summary
        totals = summary.totals.copy() if summary is not None else DeletedTotals()
        pending = summary.pending if summary is not None else frozenset()
        live = self.segment_ids()
        for seg_id, record in self.deleted.items():
            if seg_id not in pending and seg_id not in live:
                totals.add_record(record)
        return totals


@dataclass
class CompactionReport:
    folded_records: list[str] = field(default_factory=list)
    removed_commits: list[int] = field(default_factory=list)
    removed_failures: list[str] = field(default_factory=list)
    removed_summaries: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.folded_records) + len(self.removed_commits) + len(self.removed_failures)


def _record_in_place(prefix: str, topic: str, record: DeletedRecord) -> bool:
    """Whether a deleted-segment record's data and index keys (each may be empty) are its segment's in the
    directory of ``topic`` (``mf.segment_keys``, either format): only then does compaction delete them."""
    for version in (1, 2):
        try:
            data, index = mf.segment_keys(prefix, topic, record.segment_id, record.start[0], version)
        except ValueError:
            return False
        if record.data_key in ("", data) and record.index_key in ("", index):
            return True
    return False


def _start_ledger(key: str) -> int:
    """The start ledger of a manifest key (or its last component); -1 for a key that is not one."""
    try:
        return keys.parse_manifest_name(key)[0]
    except ValueError:
        return -1


@dataclass(slots=True)
class _Cached:
    size: int
    modified: float
    value: SegmentRecord | DeletedLedger | DeletedRecord | DeletedSummary | None
    """What the object decodes to, by its kind (None: undecodable)."""
    final: bool
    """Never re-read while listed (Offloaded manifests, create-only marks, records and summaries)."""


class MetadataView:
    """An incremental view of the metadata under a ``MetadataStore``: what a periodic pass costs is
    proportional to what changed, not to the history.

    * ``refresh(topic)`` lists the topic's ``_meta/`` once (manifests, commits, failure notes, deletion
      marks, deleted-segment records and their summary come in that one listing) and reads only objects it
      has not read before: Offloaded manifests, marks, records and summaries never change once written,
      so they are cached by key for as long as they are listed (a manifest as its ``SegmentRecord``); an
      Assigned manifest is read again only when its listed size or time changed (it is rewritten once, as
      Offloaded).
    * ``topics()`` lists every key of the store (``keys.list_topic_dirs``) only at the first call and then
      every ``rediscover_s``; in between it returns the topics found then plus those it was told of
      (``add_topics``: configured topics, topics of the job's batches).
    * ``snapshot(topic)`` is what a periodic pass reads. Without ``relist_s`` it is ``refresh``. With it,
      the view is told what changed (``mark_changed``: the job whose batches write the metadata, under
      its writer lease) and lists a topic again only when it was marked, was never listed, or was last
      listed ``relist_s`` ago (for what other processes change: ``cleanup``, ``delete``): a pass over
      thousands of quiet topic-partitions then costs no request at all, where it cost a listing each.

    * With ``keep_recent``, the snapshot's commits are only the newest and those of deleted segments (what
      compaction reads), and a topic-partition's Offloaded segments beyond its newest ``keep_recent`` are folded
      (``SegmentFold``: sums, per ledger what retention reads) and their records and cache entries dropped, so
      the view's memory stays bounded however long the job runs. A listing skips the folded keys (all at or
      below the fold's ``through`` key that the view does not hold) and counts them per start ledger
      (``_check_fold``): a ledger's group whose keys are all gone is dropped, one that lost or gained some is
      read again, and keys where nothing was folded make the view read the topic-partition from scratch. A
      segment with a failure note or a deleted-segment record is not folded. Deleting folded segments
      (``apply_deletions``) lists them again and reads the manifests of the ledgers that may go.

    Writes made through the view (``mark_ledger_deleted``, ``apply_deletions``, ``compact``) update the
    cache and the snapshot, so the next pass does not read back what this process wrote. Not thread-safe
    (one per thread), except ``mark_changed``, which any thread may call.
    """

    def __init__(
        self,
        meta: MetadataStore,
        *,
        rediscover_s: float = 3600.0,
        relist_s: float | None = None,
        keep_recent: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep_recent is not None and keep_recent < 1:
            raise ValueError(f"keep_recent must be at least 1 (the newest segment is always held), got {keep_recent}")
        self.meta = meta
        self.rediscover_s = rediscover_s
        self.relist_s = relist_s
        self.keep_recent = keep_recent
        self.clock = clock
        self._folds: dict[str, SegmentFold] = {}
        self._known: set[str] = set()
        self._discovered_at: float | None = None
        self._cache: dict[str, dict[str, _Cached]] = {}
        self._snapshots: dict[str, TopicMeta] = {}
        self._listed_at: dict[str, float] = {}
        self._changed: set[str] = set()
        self._changed_lock = threading.Lock()
        self.listings = 0
        """Topic listings made (``refresh``): what a pass cost."""

    # -- topics --------------------------------------------------------------------------------

    def add_topics(self, topics: Iterable[TopicName | str]) -> None:
        self._known.update(str(t) for t in topics)

    def topics(self, extra: Iterable[TopicName | str] = ()) -> list[str]:
        """Known topic-partitions: rediscovered from the whole store at the first call and every
        ``rediscover_s`` (0: every call), plus ``extra`` and those added."""
        now = self.clock()
        if self._discovered_at is None or now - self._discovered_at >= self.rediscover_s:
            self._known = {str(t) for t in self.meta.topics()} | {t for t in self._known if t in self._snapshots}
            self._discovered_at = now
        self.add_topics(extra)
        return sorted(self._known)

    def mark_changed(self, topics: Iterable[TopicName | str]) -> None:
        """These topic-partitions' metadata changed (or may have): ``snapshot`` lists them again."""
        with self._changed_lock:
            self._changed.update(str(t) for t in topics)

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self, topic: TopicName | str) -> TopicMeta:
        """The topic's metadata for a periodic pass: ``refresh`` without ``relist_s``; with it, listed again
        only when marked changed, never listed, or listed ``relist_s`` ago, else as last seen."""
        name = str(topic)
        if self.relist_s is None:
            return self.refresh(name)
        with self._changed_lock:
            changed = name in self._changed
            self._changed.discard(name)  # before the listing: a change marked while it runs is kept
        listed = self._listed_at.get(name)
        snap = self._snapshots.get(name)
        if changed or snap is None or listed is None or self.clock() - listed >= self.relist_s:
            return self.refresh(name)
        return snap

    def refresh(self, topic: TopicName | str) -> TopicMeta:
        """List the topic's ``_meta/`` once and read what is new or changed."""
        name = str(topic)
        self._listed_at[name] = self.clock()
        self.listings += 1
        prefix = keys.topic_dir(self.meta.prefix, name) + _META
        store = self.meta.store
        old = self._cache.get(name, {})
        cache: dict[str, _Cached] = {}
        fold = self._folds.get(name)
        snap = TopicMeta(name) if fold is None else TopicMeta(name, fold=fold)
        folded_listed: dict[int, int] = {}
        for info in store.list(prefix):
            kind, _, rest = info.key[len(prefix) :].partition("/")
            if not rest or "/" in rest:
                continue
            if fold is not None and kind == "segments" and info.key <= fold.through and info.key not in old:
                ledger = _start_ledger(rest)
                folded_listed[ledger] = folded_listed.get(ledger, 0) + 1
                continue
            if kind == "failures":
                snap.failures[rest] = info
                continue
            if kind == "commits":
                with contextlib.suppress(ValueError):
                    snap.commits[keys.parse_commit_name(rest)] = info
                continue
            if kind not in ("segments", "deleted", "deleted-segments", "deleted-summary"):
                continue
            entry = old.get(info.key)
            if entry is None or not (entry.final or (entry.size, entry.modified) == (info.size, info.last_modified)):
                entry = self._read(name, kind, info)
                if entry is None:
                    continue
            cache[info.key] = entry
            value = entry.value
            if value is None:
                snap.corrupt.append(info.key)
            elif isinstance(value, SegmentRecord):  # each kind decodes to one type (_read)
                snap.segments[info.key] = value
            elif isinstance(value, DeletedLedger):
                snap.marks[value.ledgerId] = value
            elif isinstance(value, DeletedRecord):
                snap.deleted[rest] = value
            else:
                snap.summaries[value.seq] = value
        if fold is not None and not self._check_fold(snap, folded_listed):
            log.info("%s: segments appeared among the folded ones: reading its metadata again", name)
            self._folds.pop(name, None)
            self._cache.pop(name, None)
            return self.refresh(name)
        if self.keep_recent is not None:
            self._fold(snap, cache)
            # A commit per segment ever offloaded: compaction needs only the newest and those of deleted segments.
            if len(snap.commits) > 1:
                wanted = {record.ordinal for record in snap.deleted.values()}
                newest = max(snap.commits)
                snap.commits = {o: info for o, info in snap.commits.items() if o == newest or o in wanted}
        self._cache[name] = cache
        self._snapshots[name] = snap
        self._known.add(name)
        return snap

    def _check_fold(self, snap: TopicMeta, listed: dict[int, int]) -> bool:
        """Mend the fold from a listing's count of folded keys per start ledger: a group that lost all its
        segments (deleted: retention's view beside the metrics', ``delete``) goes; one that lost some is read
        again (its remaining manifests; typically the one segment that runs on into a ledger not yet marked).
        False when keys appeared where nothing was folded (written by another process): read it all again."""
        fold = snap.fold
        regroup = []
        for ledger, group in list(fold.groups.items()):
            n = listed.pop(ledger, 0)
            if n == 0:
                del fold.groups[ledger]
            elif n != group.totals.segments:
                regroup.append(ledger)
        if listed:
            return False
        if regroup:
            groups = {ledger: FoldGroup() for ledger in regroup}
            for _manifest, record in self._folded_manifests(snap, max(regroup), set(regroup)):
                if not record.offloaded:
                    return False  # an unfinished attempt among the folded keys: another writer; read it all
                groups[record.start[0]].add(record)
            for ledger, group in groups.items():
                if group.totals.segments:
                    fold.groups[ledger] = group
                else:
                    fold.groups.pop(ledger, None)
        return True

    def _fold(self, snap: TopicMeta, cache: dict[str, _Cached]) -> None:
        """Fold the readable segments beyond the newest ``keep_recent`` into the topic-partition's fold."""
        assert self.keep_recent is not None
        readable = snap.offloaded()
        if len(readable) <= self.keep_recent:
            return
        fold = self._folds.setdefault(snap.topic, snap.fold)
        for record in readable[: len(readable) - self.keep_recent]:
            if record.segment_id in snap.failures or record.segment_id in snap.deleted:
                continue  # compaction and the deleted totals look these up by id: held
            fold.add(record)
            del snap.segments[record.key]
            cache.pop(record.key, None)

    def _read(self, topic: str, kind: str, info: ObjectInfo) -> _Cached | None:
        try:
            if kind == "segments":
                record = SegmentRecord.of(info.key, self.meta.read_manifest(info.key, topic))
                return _Cached(info.size, info.last_modified, record, record.offloaded)
            data = self.meta.store.get(info.key)
            if kind == "deleted":
                value: DeletedLedger | DeletedRecord | DeletedSummary = mf.decode_deleted_ledger(data, where=info.key)
            elif kind == "deleted-segments":
                value = DeletedRecord.decode(data, where=info.key)
            else:
                value = DeletedSummary.decode(data, where=info.key)
        except ObjectNotFoundError:
            return None  # deleted between the listing and the read
        except FormatError as err:  # undecodable, or a manifest misplaced (mf.check_place)
            log.warning("skipping unreadable metadata object: %s", err)
            return _Cached(info.size, info.last_modified, None, False)  # read again only once it changes
        return _Cached(info.size, info.last_modified, value, True)

    def _current(self, topic: TopicName | str) -> TopicMeta:
        snap = self._snapshots.get(str(topic))
        return snap if snap is not None else self.refresh(topic)

    def _remember(self, topic: str, key: str, value: DeletedLedger | DeletedRecord | DeletedSummary) -> None:
        self._cache.setdefault(topic, {})[key] = _Cached(-1, -1.0, value, True)

    def _forget(self, topic: str, key: str) -> None:
        self._cache.get(topic, {}).pop(key, None)

    # -- writing -------------------------------------------------------------------------------

    def mark_ledger_deleted(
        self, topic: TopicName | str, ledger_id: int, reason: str, at_ms: int | None = None
    ) -> bool:
        """``MetadataStore.mark_ledger_deleted``, without a read when the view knows the mark exists."""
        name = str(topic)
        snap = self._current(name)
        if ledger_id in snap.marks:
            return False
        at = now_ms() if at_ms is None else at_ms
        if not self.meta.mark_ledger_deleted(name, ledger_id, reason, at):
            return False
        mark = DeletedLedger(ledgerId=ledger_id, deletedTimestamp=at, reason=reason)
        snap.marks[ledger_id] = mark
        self._remember(name, keys.deleted_mark_key(self.meta.prefix, name, ledger_id), mark)
        return True

    def apply_deletions(self, topic: TopicName | str, lag_ms: int, at_ms: int | None = None) -> list[SegmentManifest]:
        """Delete the segments whose ledgers are all marked deleted past the lag (from the view). Each one's
        manifest is read again, as deleting needs all of it (its objects, its counts for the record)."""
        name = str(topic)
        at = now_ms() if at_ms is None else at_ms
        snap = self._current(name)
        done = []
        for segment in snap.offloaded():
            if not all_marked([span.ledger_id for span in segment.spans], snap.marks, lag_ms, at):
                continue
            key = segment.key
            try:
                manifest = self.meta.read_manifest(key, name)
            except ObjectNotFoundError:  # deleted by another process (cleanup) since the listing
                snap.segments.pop(key, None)
                self._forget(name, key)
                continue
            except FormatError as err:  # rewritten since the listing, and no longer trusted: left alone
                log.warning("retention of %s: leaving %s alone: %s", name, key, err)
                continue
            record = self.meta.delete_segment(manifest, at)
            snap.segments.pop(key, None)
            self._forget(name, key)
            snap.deleted[record.segment_id] = record
            self._remember(name, self.meta.deleted_segment_key(manifest), record)
            self._keep_commit(snap, manifest.ordinal)
            done.append(manifest)
        # The folded segments' ledgers that may go; listed again only when that set changed since the last time
        # (a segment that runs on into a ledger not yet marked stays until that one is).
        going = frozenset(lid for lid in snap.fold.ledgers if all_marked([lid], snap.marks, lag_ms, at))
        if going and going != snap.fold.swept:
            done.extend(self._delete_folded(snap, max(going), lag_ms, at))
            snap.fold.swept = going
        return done

    def _delete_folded(self, snap: TopicMeta, up_to_ledger: int, lag_ms: int, at: int) -> list[SegmentManifest]:
        """Delete the folded segments whose ledgers are all marked deleted past the lag: the view holds no
        record of them, so their keys are listed again (in position order, up to the last ledger that may
        go) and their manifests read."""
        name = snap.topic
        done = []
        for manifest, record in self._folded_manifests(snap, up_to_ledger):
            if not all_marked([span.ledger_id for span in record.spans], snap.marks, lag_ms, at):
                continue
            deleted = self.meta.delete_segment(manifest, at)
            snap.fold.remove(record)
            snap.deleted[deleted.segment_id] = deleted
            self._remember(name, self.meta.deleted_segment_key(manifest), deleted)
            self._keep_commit(snap, manifest.ordinal)
            done.append(manifest)
        return done

    def _folded_manifests(
        self, snap: TopicMeta, up_to_ledger: int, ledgers: set[int] | None = None
    ) -> Iterator[tuple[SegmentManifest, SegmentRecord]]:
        """The folded segments' manifests (listed again: the view holds no record of them) that start in a
        ledger up to ``up_to_ledger`` (and in ``ledgers``, if given), in position order. One deleted since the
        listing is skipped: the next listing's count mends the fold."""
        fold = snap.fold
        held = self._cache.get(snap.topic, {})
        for info in self.meta.store.list(keys.manifests_prefix(self.meta.prefix, snap.topic)):
            if info.key > fold.through:
                return
            start_ledger = _start_ledger(info.key)
            if start_ledger > up_to_ledger:
                return
            if start_ledger < 0 or info.key in held or (ledgers is not None and start_ledger not in ledgers):
                continue
            try:
                manifest = self.meta.read_manifest(info.key, snap.topic)
            except ObjectNotFoundError:
                continue
            except FormatError as err:  # rewritten since it was folded: left to the next listing
                log.warning("skipping unreadable metadata object: %s", err)
                continue
            yield manifest, SegmentRecord.of(info.key, manifest)

    def _keep_commit(self, snap: TopicMeta, ordinal: int) -> None:
        """A folding view holds few commits (``refresh``): a segment deleted now has its commit held for the
        compaction that follows (a segment written without one costs a DELETE of nothing, once)."""
        if self.keep_recent is not None and ordinal not in snap.commits:
            snap.commits[ordinal] = ObjectInfo(keys.commit_key(self.meta.prefix, snap.topic, ordinal), 0)

    def compact(
        self, topic: TopicName | str, *, grace_ms: int = 3_600_000, at_ms: int | None = None
    ) -> CompactionReport:
        """Remove the metadata nothing needs any more (from the view; no reads unless it folds records):

        * deleted-segment records whose deletion finished (no manifest left), except the newest of the
          topic (status tells "deleted by retention" from it): their counts are folded first into a new
          create-only version of ``_meta/deleted-summary/`` (metrics totals survive restarts), then the
          records and older summary versions are removed; their data and index objects are deleted again
          (a no-op unless a crash interrupted the deletion);
        * ``_meta/commits/<ordinal>`` of deleted segments, except the topic's newest commit, which tells
          where the topic continues;
        * failure notes of attempts that no longer exist, older than ``grace_ms``.

        Safe beside another compaction (the cleanup command beside the job): of two writing the same
        summary version, the second stops."""
        name = str(topic)
        at = now_ms() if at_ms is None else at_ms
        snap = self._current(name)
        report = CompactionReport()
        store = self.meta.store
        live_ids = snap.segment_ids()
        live_ordinals = {r.ordinal for r in snap.segments.values() if r.offloaded}

        for seg_id, info in list(snap.failures.items()):
            if seg_id not in live_ids and at - info.last_modified * 1000 >= grace_ms:
                store.delete(info.key)
                del snap.failures[seg_id]
                report.removed_failures.append(seg_id)

        finished = [r for seg_id, r in snap.deleted.items() if seg_id not in live_ids]
        newest_commit = max(snap.commits) if snap.commits else None
        for record in finished:
            ordinal = record.ordinal
            if ordinal is None or ordinal == newest_commit or ordinal in live_ordinals or ordinal not in snap.commits:
                continue
            store.delete(snap.commits.pop(ordinal).key)
            report.removed_commits.append(ordinal)

        if not finished:
            return report
        keep = max(finished, key=lambda r: (r.deleted_ms, -1 if r.ordinal is None else r.ordinal, r.end))
        summary = snap.summary
        pending = summary.pending if summary is not None else frozenset()
        counted = [r for r in finished if r is not keep and r.segment_id in pending]
        fold = [r for r in finished if r is not keep and r.segment_id not in pending]
        if fold:
            totals = summary.totals.copy() if summary is not None else DeletedTotals()
            for record in fold:
                totals.add_record(record)
            seq = max(snap.summaries, default=0) + 1
            new = DeletedSummary(seq, totals, frozenset(r.segment_id for r in [*counted, *fold]))
            key = self._summary_key(name, seq)
            try:
                store.put(key, new.encode(), if_absent=True)
            except ObjectExistsError:
                log.info("compaction of %s: summary %d was written by another compaction; next pass", name, seq)
                return report
            snap.summaries[seq] = new
            self._remember(name, key, new)
        for old_seq in [s for s in snap.summaries if s < max(snap.summaries, default=0)]:
            store.delete(self._summary_key(name, old_seq))
            del snap.summaries[old_seq]
            report.removed_summaries.append(old_seq)
        for record in [*counted, *fold]:
            if not _record_in_place(self.meta.prefix, name, record):
                log.warning(
                    "compaction of %s: deleted-segment record %s names objects that are not its segment's here "
                    "(%s, %s): they are left alone",
                    name,
                    record.segment_id,
                    record.data_key,
                    record.index_key,
                )
                record = replace(record, data_key="", index_key="", checksum_blocks=0)
            if record.data_key and record.checksum_blocks:
                delete_block_checksums(store, record.data_key, record.checksum_blocks)
            for key in (record.data_key, record.index_key):
                if key:
                    store.delete(key)
            record_key = keys.deleted_segments_prefix(self.meta.prefix, name) + record.segment_id
            store.delete(record_key)
            snap.deleted.pop(record.segment_id, None)
            self._forget(name, record_key)
            report.folded_records.append(record.segment_id)
        return report

    def _summary_key(self, topic: str, seq: int) -> str:
        return keys.deleted_summary_prefix(self.meta.prefix, topic) + f"{seq:020d}"
