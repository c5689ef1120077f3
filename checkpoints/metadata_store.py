"""The offload metadata store: segment manifests and ledger deletion marks, kept in the same object
store as the data so a reader needs nothing but the store.

Crash safety rests on four rules: manifests are written last (a segment is readable only once its
manifest says Offloaded, after its data and index objects are durable); every write is idempotent
(deterministic keys, whole-object puts); every segment is **committed** create-only in its place in the
topic's history (``_meta/commits/<ordinal>``, holding the sealed manifest) before its manifest says
Offloaded, so two writers can never both commit a place and the store alone tells where a topic-partition
continues (``resume_point``); and recovery converges (``recover`` at every run start publishes a commit a
crash left unpublished and abandons every attempt past the last commit; ``cleanup`` removes superseded
attempts, unfinished uploads, orphan objects and half-done deletions).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.cleanup_guard import CleanupGuard
from streamoffload.checkpoints.deleted_segments import DeletedRecord, select_deletable
from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.checkpoints.manifest import OFFLOADED
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.managed_ledger_pb2 import ManagedLedgerInfo
from streamoffload.codecs.proto.offload_manifest_pb2 import DeletedLedger, SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.storage import keys
from streamoffload.storage.base import (
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    StorageError,
)
from streamoffload.storage.location import ScopedStore

log = logging.getLogger(__name__)

LedgerInfo = ManagedLedgerInfo.LedgerInfo


def now_ms() -> int:
    return int(time.time() * 1000)


class CommitConflictError(CheckpointError):
    """Another segment already holds this place in the topic's history (another writer committed it)."""


@dataclass(frozen=True)
class ResumePoint:
    """Where a topic-partition continues, from the store alone."""

    last: Position | None
    """The last position of the last committed segment (None: nothing committed yet)."""
    next_ordinal: int
    """The place of the next segment in the topic's history."""


@dataclass
class CleanupReport:
    superseded_manifests: list[str] = field(default_factory=list)
    aborted_uploads: list[str] = field(default_factory=list)
    orphan_objects: list[str] = field(default_factory=list)
    finished_deletions: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return (
            len(self.superseded_manifests)
            + len(self.aborted_uploads)
            + len(self.orphan_objects)
            + len(self.finished_deletions)
        )


@dataclass(frozen=True)
class CorruptManifest:
    """A segment manifest that does not decode, or that is not trusted where it stands (``mf.check_place``): its
    key, what is wrong, and what its key alone tells."""

    key: str
    error: str
    """The decoding error, one line (names the key and the byte offset)."""
    offset: int | None = None
    start: Position | None = None
    """The segment's start position, from the key (None if the key is not a manifest key)."""
    segment_id: str | None = None
    foreign: bool = False
    """It decodes, but is another topic's or names objects that are not its segment's here: it holds none of
    this topic's entries, so a read goes on without it (a store moved to a new prefix is not foreign: its
    manifests are this topic's, named under the old prefix, and a read that may need them is refused)."""

    @classmethod
    def of(cls, key: str, err: FormatError) -> CorruptManifest:
        foreign = isinstance(err, mf.MisplacedManifestError) and err.moved_from is None
        try:
            ledger, entry, seg_id = keys.parse_manifest_name(key)
        except ValueError:
            return cls(key, str(err), err.offset, foreign=foreign)
        return cls(key, str(err), err.offset, (ledger, entry), seg_id, foreign)


class MetadataStore:
    """Offload metadata of every topic-partition in a scoped store (under its key prefix)."""

    def __init__(self, scoped: ScopedStore) -> None:
        self.scoped = scoped
        self.store = scoped.store
        self.prefix = scoped.prefix

    # -- manifests ---------------------------------------------------------------------------------

    def manifest_key(self, manifest: SegmentManifest) -> str:
        return keys.manifest_key(
            self.prefix, manifest.topic, manifest.startLedgerId, manifest.startEntryId, str(mf.manifest_uuid(manifest))
        )

    def read_manifest(self, key: str, topic: TopicName | str) -> SegmentManifest:
        """The manifest (or commit) at ``key`` of ``topic``, decoded strictly and trusted only where it stands
        (``mf.check_place``): ``MisplacedManifestError`` (a ``FormatError``) names one whose topic or keys are
        not those of its place, so every path that skips an undecodable manifest skips it too."""
        return mf.check_place(
            mf.decode_manifest(self.store.get(key), where=key), key=key, prefix=self.prefix, topic=topic
        )

    def check_keys(self, manifest: SegmentManifest) -> None:
        """Refuse (``MisplacedManifestError``) to act on a manifest whose keys are not its own topic's in this
        store: the last check before its objects are deleted, however the manifest came here."""
        mf.check_place(manifest, key=self.manifest_key(manifest), prefix=self.prefix, topic=manifest.topic)

    def put_manifest(self, manifest: SegmentManifest) -> None:
        self.store.put(self.manifest_key(manifest), mf.encode_manifest(manifest))

    def open_attempt(self, manifest: SegmentManifest) -> SegmentManifest:
        """Write an Assigned manifest create-only; if the attempt exists already (a replay), return the
        manifest that was written first, whose policy and upload id the replay must use."""
        try:
            self.store.put(self.manifest_key(manifest), mf.encode_manifest(manifest), if_absent=True)
            return manifest
        except ObjectExistsError:
            return self.read_manifest(self.manifest_key(manifest), manifest.topic)

    def _manifests(self, topic: TopicName | str, corrupt: list[CorruptManifest] | None = None) -> list[SegmentManifest]:
        """Every manifest that decodes and stands where it was written (``read_manifest``), in key
        (start-position) order. One that does not is logged and skipped, so it cannot stop every other topic's
        status, cleanup or reads; it is appended to ``corrupt`` when given (``corrupt_manifests`` reports them)."""
        out = []
        for info in self.store.list(keys.manifests_prefix(self.prefix, topic)):
            try:
                out.append(self.read_manifest(info.key, topic))
            except ObjectNotFoundError:
                continue  # deleted between list and get
            except FormatError as err:
                # INFO, not WARNING: callers report corrupt manifests themselves (status, verify, read,
                # metrics), so the terminal gets one line for one problem.
                log.info("skipping corrupt segment manifest: %s", err)
                if corrupt is not None:
                    corrupt.append(CorruptManifest.of(info.key, err))
        return out

    def corrupt_manifests(self, topic: TopicName | str) -> list[CorruptManifest]:
        """The manifests of the topic-partition that do not decode (bad checksum, missing fields...): the
        readers and ``cleanup`` skip them, ``status`` and ``verify`` report them."""
        corrupt: list[CorruptManifest] = []
        self._manifests(topic, corrupt)
        return corrupt

    def manifests(self, topic: TopicName | str, corrupt: list[CorruptManifest] | None = None) -> list[SegmentManifest]:
        """Every manifest of the topic-partition (any status), in start-position order. An unfinished
        attempt with a recorded failure is reported as Failed, with why. Manifests that do not decode are
        skipped (and appended to ``corrupt`` when given)."""
        manifests = self._manifests(topic, corrupt)
        failures = self.failures(topic)
        if not failures:
            return manifests
        return [
            mf.failed_manifest(m, failures[str(mf.manifest_uuid(m))])
            if m.status != OFFLOADED and str(mf.manifest_uuid(m)) in failures
            else m
            for m in manifests
        ]

    # -- commits: the topic's history, one create-only object per place --------------------------

    def commit(self, sealed: SegmentManifest) -> None:
        """Commit an offloaded segment in its place (``sealed.ordinal``) of the topic's history, then
        publish its Offloaded manifest. Idempotent for the same segment; ``CommitConflictError`` when
        another segment holds the place (a fenced writer, or a second instance)."""
        key = keys.commit_key(self.prefix, sealed.topic, sealed.ordinal)
        data = mf.encode_manifest(sealed)
        try:
            self.store.put(key, data, if_absent=True)
        except ObjectExistsError:
            holder = self.read_manifest(key, sealed.topic)
            if mf.manifest_uuid(holder) != mf.manifest_uuid(sealed):
                raise CommitConflictError(
                    f"{sealed.topic}: segment {sealed.ordinal} of the topic's history was already committed by "
                    f"segment {mf.manifest_uuid(holder)} (epoch {mf.driver_property(holder, mf.PROP_EPOCH)}); "
                    f"segment {mf.manifest_uuid(sealed)} is refused: another writer owns this store prefix"
                ) from None
        self.put_manifest(sealed)
        self.store.delete(keys.failure_key(self.prefix, sealed.topic, str(mf.manifest_uuid(sealed))))

    def last_commit(self, topic: TopicName | str) -> SegmentManifest | None:
        names = [info.key for info in self.store.list(keys.commits_prefix(self.prefix, topic))]
        for key in reversed(names):
            try:
                keys.parse_commit_name(key)
                return self.read_manifest(key, topic)
            except (ValueError, ObjectNotFoundError):
                continue
        return None

    def resume_point(self, topic: TopicName | str) -> ResumePoint:
        last = self.last_commit(topic)
        if last is None:
            return ResumePoint(None, 0)
        return ResumePoint(mf.end_position(last), last.ordinal + 1)

    def recover(self, topic: TopicName | str) -> ResumePoint:
        """Make the store agree with its commits; run by the lease holder before it writes the topic.

        The last commit's manifest is published if a crash came between the two writes; every attempt
        that starts after the last committed position (opened by an earlier run or a fenced writer) is
        abandoned: its upload aborted, its objects and manifest deleted. Returns where to continue."""
        last = self.last_commit(topic)
        point = ResumePoint(None, 0) if last is None else ResumePoint(mf.end_position(last), last.ordinal + 1)
        if last is not None:
            key = self.manifest_key(last)
            try:
                published = self.read_manifest(key, topic).status == OFFLOADED
            except ObjectNotFoundError:
                published = False
            if not published:
                self.put_manifest(last)
        for start, _seg_id, key in self.manifest_entries(topic):
            if point.last is not None and start <= point.last:
                continue
            try:
                attempt = self.read_manifest(key, topic)
            except ObjectNotFoundError:
                continue
            except FormatError as err:  # unreadable: leave it (and its objects) to cleanup and verify
                log.warning("recovering %s: skipping an unreadable attempt: %s", topic, err)
                continue
            if attempt.status != OFFLOADED:
                self._abandon(attempt)
        return point

    def record_failure(self, topic: TopicName | str, segment_id: str, failure: str) -> None:
        """Say why an attempt failed (for status); the attempt's manifest itself is never rewritten."""
        self.store.put(keys.failure_key(self.prefix, topic, segment_id), failure[:4000].encode())

    def failures(self, topic: TopicName | str) -> dict[str, str]:
        prefix = keys.failures_prefix(self.prefix, topic)
        out = {}
        for info in self.store.list(prefix):
            try:
                out[info.key[len(prefix) :]] = self.store.get(info.key).decode(errors="replace")
            except ObjectNotFoundError:
                continue
        return out

    def offloaded_segments(
        self, topic: TopicName | str, corrupt: list[CorruptManifest] | None = None
    ) -> list[SegmentManifest]:
        """The readable segments of the topic-partition, in position order.

        Should two Offloaded manifests ever overlap (they cannot when replays are deterministic),
        the one with the lower ordinal wins and the other is skipped, so a reader never returns an
        entry twice. A manifest that does not decode is skipped (and appended to ``corrupt`` when given):
        a reader that must not miss entries checks ``corrupt_manifests``."""
        out: list[SegmentManifest] = []
        for manifest in self._manifests(topic, corrupt):
            if manifest.status != OFFLOADED:
                continue
            if out and mf.start_position(manifest) <= mf.end_position(out[-1]):
                log.warning("skipping overlapping segment %s of %s", mf.manifest_uuid(manifest), topic)
                continue
            out.append(manifest)
        return out

    def segments_for_range(
        self, topic: TopicName | str, start: Position | None = None, end: Position | None = None
    ) -> list[SegmentManifest]:
        """Offloaded segments holding any position in ``[start, end]`` (both inclusive; None = open)."""
        return [
            m
            for m in self.offloaded_segments(topic)
            if (start is None or mf.end_position(m) >= start) and (end is None or mf.start_position(m) <= end)
        ]

    def topics(self) -> list[TopicName]:
        return keys.list_topic_dirs(self.scoped)

    def ledgers(self, topic: TopicName | str) -> list[LedgerInfo]:
        """The managed-ledger view: one LedgerInfo per offloaded ledger, whose OffloadContext lists
        every segment holding part of it (PIP-76), in ledger order."""
        deleted = self.deleted_ledgers(topic)
        merged: dict[int, LedgerInfo] = {}
        for manifest in self.offloaded_segments(topic):
            for info in manifest.ledgers:
                into = merged.get(info.ledgerId)
                if into is None:
                    into = merged[info.ledgerId] = LedgerInfo()
                    into.CopyFrom(info)
                    continue
                into.entries += info.entries
                into.size += info.size
                into.timestamp = max(into.timestamp, info.timestamp)
                into.offloadContext.offloadSegment.extend(info.offloadContext.offloadSegment)
        for ledger_id, info in merged.items():
            info.offloadContext.complete = True
            if ledger_id in deleted:
                info.offloadContext.bookkeeperDeleted = True
        return [merged[k] for k in sorted(merged)]

    # -- deletion ----------------------------------------------------------------------------------

    def mark_ledger_deleted(
        self, topic: TopicName | str, ledger_id: int, reason: str, at_ms: int | None = None
    ) -> bool:
        """Mark a ledger deleted; False if it already was (the first mark's time is kept: the mark is
        created create-only, so of two marking at once one wins)."""
        key = keys.deleted_mark_key(self.prefix, topic, ledger_id)
        try:
            self.store.put(
                key, mf.encode_deleted_ledger(ledger_id, now_ms() if at_ms is None else at_ms, reason), if_absent=True
            )
        except ObjectExistsError:
            return False
        return True

    def deleted_ledgers(self, topic: TopicName | str) -> dict[int, DeletedLedger]:
        out = {}
        for info in self.store.list(keys.deleted_marks_prefix(self.prefix, topic)):
            try:
                mark = mf.decode_deleted_ledger(self.store.get(info.key), where=info.key)
            except (ObjectNotFoundError, FormatError) as err:
                log.warning("ignoring deletion mark %s: %s", info.key, err)
                continue
            out[mark.ledgerId] = mark
        return out

    def deletable_segments(
        self, topic: TopicName | str, lag_ms: int, at_ms: int | None = None
    ) -> list[SegmentManifest]:
        """Offloaded segments whose ledgers are ALL marked deleted, the newest mark older than the lag."""
        at = now_ms() if at_ms is None else at_ms
        return select_deletable(self.offloaded_segments(topic), self.deleted_ledgers(topic), lag_ms, at)

    def delete_segment(self, manifest: SegmentManifest, at_ms: int | None = None) -> DeletedRecord:
        """Delete a segment: record the deletion (with its entry and byte counts, so totals survive it),
        drop the manifest (readers stop seeing it), then the objects. A crash midway is finished by
        ``cleanup`` from the record. Returns the record."""
        self.check_keys(manifest)
        record = DeletedRecord.of(manifest, now_ms() if at_ms is None else at_ms)
        self.store.put(self.deleted_segment_key(manifest), record.encode())
        self._delete_segment_objects(manifest)
        return record

    def deleted_segment_key(self, manifest: SegmentManifest) -> str:
        return keys.deleted_segments_prefix(self.prefix, manifest.topic) + str(mf.manifest_uuid(manifest))

    def _delete_segment_objects(self, manifest: SegmentManifest) -> None:
        self.check_keys(manifest)
        self.store.delete(self.manifest_key(manifest))
        if manifest.dataKey:
            if manifest.status == OFFLOADED:  # its manifest says how many (no LIST on the retention path)
                delete_block_checksums(self.store, manifest.dataKey, mf.checksum_blocks(manifest))
            else:  # an unfinished attempt wrote some: find them
                delete_block_checksums(self.store, manifest.dataKey)
                delete_part_frames(self.store, manifest.dataKey)
        for key in (manifest.indexKey, manifest.dataKey):
            if key:
                self.store.delete(key)

    def deleted_segment_ids(self, topic: TopicName | str) -> set[str]:
        prefix = keys.deleted_segments_prefix(self.prefix, topic)
        return {info.key[len(prefix) :] for info in self.store.list(prefix)}

    def apply_deletions(self, topic: TopicName | str, lag_ms: int, at_ms: int | None = None) -> list[SegmentManifest]:
        done = []
        for manifest in self.deletable_segments(topic, lag_ms, at_ms):
            self.delete_segment(manifest, at_ms)
            done.append(manifest)
        return done

    # -- cleanup -----------------------------------------------------------------------------------

    def manifest_entries(self, topic: TopicName | str) -> list[tuple[Position, str, str]]:
        """``(start position, segment uuid, key)`` of every manifest, from the keys alone (no reads)."""
        out = []
        for info in self.store.list(keys.manifests_prefix(self.prefix, topic)):
            try:
                ledger, entry, seg_id = keys.parse_manifest_name(info.key)
            except ValueError:
                continue
            out.append(((ledger, entry), seg_id, info.key))
        return out

    def manifest_by_id(self, topic: TopicName | str, segment_id: str) -> SegmentManifest | None:
        for _, seg_id, key in self.manifest_entries(topic):
            if seg_id == segment_id:
                try:
                    return self.read_manifest(key, topic)
                except ObjectNotFoundError:
                    return None
        return None

    def supersede(self, sealed: SegmentManifest, listed: list[tuple[Position, str, str]] | None = None) -> list[str]:
        """After ``sealed`` became Offloaded: remove Assigned/Failed attempts at the same positions
        (left by a non-identical replay), with their uploads and objects. Returns the removed keys.

        Runs after every seal, so it picks candidates by the start position and uuid in the manifest
        keys and reads only those, not the topic's whole history."""
        removed = []
        sealed_id = str(mf.manifest_uuid(sealed))
        low, high = mf.start_position(sealed), mf.end_position(sealed)
        for start, seg_id, key in self.manifest_entries(sealed.topic) if listed is None else listed:
            if seg_id == sealed_id or not low <= start <= high:
                continue
            try:
                other = self.read_manifest(key, sealed.topic)
            except ObjectNotFoundError:
                continue
            except FormatError as err:  # undecodable or misplaced: left alone, for verify and a human
                log.warning("superseding attempts of %s: leaving %s alone: %s", sealed.topic, key, err)
                continue
            if other.status != OFFLOADED:
                self._abandon(other)
                removed.append(key)
        return removed

    def _abandon(self, manifest: SegmentManifest) -> None:
        """Remove an unfinished attempt: its upload (by the id its manifest recorded), objects, manifest."""
        self.check_keys(manifest)
        upload_id = mf.driver_property(manifest, mf.PROP_UPLOAD_ID)
        if upload_id and manifest.dataKey:
            try:
                self.store.resume_multipart(manifest.dataKey, upload_id).abort()
            except StorageError as err:  # completed, or already aborted
                log.debug("abandoning %s: upload %s: %s", manifest.dataKey, upload_id, err)
        self._delete_segment_objects(manifest)
        self.store.delete(keys.failure_key(self.prefix, manifest.topic, str(mf.manifest_uuid(manifest))))

    def cleanup(
        self,
        topic: TopicName | str,
        *,
        grace_ms: int = 3_600_000,
        at_ms: int | None = None,
        guard: CleanupGuard | None = None,
    ) -> CleanupReport:
        """Converge the topic-partition's objects to exactly what its manifests and commits describe.

        ``grace_ms`` protects work in flight: uploads and objects that nothing names, younger than that, are
        left alone. What makes that safe is ``guard`` (taken here for this call when not given,
        ``checkpoints.cleanup_guard``): beside another instance's live lease a grace below
        ``LIVE_WRITER_GRACE_MS`` is refused, and a shorter one holds the lease itself. Nothing a manifest or a
        commit names is deleted, at any grace (a commit names its objects before its Offloaded manifest is
        written). A manifest that does not decode is logged and left alone with its objects (its key names the
        segment; what they hold is for ``verify`` and a human), so one corrupt manifest neither stops the cleanup
        nor turns its segment's objects into orphans."""
        if guard is None:
            with CleanupGuard.take(self.scoped, grace_ms) as taken:
                return self.cleanup(topic, grace_ms=grace_ms, at_ms=at_ms, guard=taken)
        guard.admit(grace_ms)
        guard.check()
        at = now_ms() if at_ms is None else at_ms
        report = CleanupReport()
        topic_dir = keys.topic_dir(self.prefix, topic)
        corrupt: list[CorruptManifest] = []

        # 1. Finish deletions a crash interrupted.
        deleted_ids = self.deleted_segment_ids(topic)
        for manifest in self.manifests(topic, corrupt):
            seg_id = str(mf.manifest_uuid(manifest))
            if seg_id in deleted_ids:
                self._delete_segment_objects(manifest)
                report.finished_deletions.append(seg_id)

        manifests = self.manifests(topic, corrupt)
        corrupt_keys = {c.key for c in corrupt}
        protected_ids = {c.segment_id for c in corrupt if c.segment_id}
        # 2. Attempts superseded by an offloaded segment covering their start position.
        listed = [entry for entry in self.manifest_entries(topic) if entry[2] not in corrupt_keys]
        for sealed in (m for m in manifests if m.status == OFFLOADED):
            report.superseded_manifests.extend(self.supersede(sealed, listed))
        manifests = self.manifests(topic, corrupt)
        protected_ids |= {c.segment_id for c in corrupt if c.segment_id}
        for key in sorted({c.key for c in corrupt}):
            log.warning("cleanup: %s: leaving corrupt segment manifest %s and its objects alone", topic, key)

        # Read after the manifests: a seal writes its commit before its Offloaded manifest, so a segment that
        # got past its commit is found in one or the other.
        named = manifests + [
            c for c in self._unpublished_commits(topic, manifests) if str(mf.manifest_uuid(c)) not in deleted_ids
        ]
        referenced = {k for m in named for k in (m.dataKey, m.indexKey) if k}
        referenced_data = {m.dataKey for m in named if m.dataKey}  # their block checksum records too
        # An open attempt's upload is the one its manifest recorded; any other upload of the same key is
        # a stray (a retried create whose id was never recorded) and goes like every other stray.
        recorded = {m.dataKey: mf.driver_property(m, mf.PROP_UPLOAD_ID) for m in manifests if m.status != OFFLOADED}

        # 3. Unfinished uploads no open segment will complete (stray uploads are never recorded in a
        # manifest). Some S3-compatible stores cannot list uploads: then there is nothing to find.
        try:
            uploads = list(self.store.pending_multiparts(topic_dir))
        except StorageError as err:
            log.warning("cleanup: cannot list unfinished uploads of %s: %s", topic_dir, err)
            uploads = []
        for upload in uploads:
            if upload.key in recorded and recorded[upload.key] in (None, upload.upload_id):
                continue
            if _segment_of(upload.key[len(topic_dir) :]) in protected_ids:
                continue
            if at - upload.initiated * 1000 < grace_ms:
                continue
            guard.check()
            self.store.resume_multipart(upload.key, upload.upload_id).abort()
            report.aborted_uploads.append(upload.key)

        # 4. Data/index objects that no manifest names (and that are not metadata).
        for info in self._topic_objects(topic_dir):
            name = info.key[len(topic_dir) :]
            if info.key in referenced or name.startswith("_") or _sidecar_of(info.key) in referenced_data:
                continue
            seg_id = _segment_of(name)
            if seg_id in protected_ids:
                continue
            if seg_id not in deleted_ids and at - info.last_modified * 1000 < grace_ms:
                continue
            guard.check()
            self.store.delete(info.key)
            report.orphan_objects.append(info.key)
        return report

    def _unpublished_commits(self, topic: TopicName | str, manifests: list[SegmentManifest]) -> list[SegmentManifest]:
        """The commits of places no Offloaded manifest in ``manifests`` holds: a seal between its commit and its
        manifest (or a crash there, which ``recover`` publishes). Each names its objects as surely as a manifest."""
        published = {m.ordinal for m in manifests if m.status == OFFLOADED}
        out = []
        for info in self.store.list(keys.commits_prefix(self.prefix, topic)):
            try:
                if keys.parse_commit_name(info.key) in published:
                    continue
                out.append(mf.decode_manifest(self.store.get(info.key), where=info.key))
            except (ValueError, ObjectNotFoundError):
                continue
            except FormatError as err:  # names nothing it can be trusted for; verify reports it
                log.warning("cleanup: %s: skipping an unreadable commit: %s", topic, err)
        return out

    def _topic_objects(self, topic_dir: str) -> Iterator[ObjectInfo]:
        for info in self.store.list(topic_dir):
            if "/" not in info.key[len(topic_dir) :]:
                yield info


def _segment_of(name: str) -> str:
    """The segment uuid of a data, index or block checksum object name
    (``<uuid>[-ledger-<id>][-index]``, ``<uuid>[-ledger-<id>]-crc-<n>``)."""
    name = name.split(keys.CHECKSUMS_INFIX)[0].split(keys.FRAMES_INFIX)[0]
    return name.split("-ledger-")[0].removesuffix("-index")


def _record_owner(key: str, infix: str) -> str | None:
    """The data object key a numbered record (``<data key><infix><n>``) belongs to, else None."""
    data_key, found, ordinal = key.rpartition(infix)
    return data_key if found and ordinal.isdigit() else None


def _checksums_of(key: str) -> str | None:
    """The data object key a block checksum record belongs to (``<data key>-crc-<n>``), else None."""
    return _record_owner(key, keys.CHECKSUMS_INFIX)


def _sidecar_of(key: str) -> str | None:
    """The data object key a block checksum record or a part frame record (``<data key>-frames-<n>``)
    belongs to, else None."""
    return _record_owner(key, keys.FRAMES_INFIX) or _checksums_of(key)


def _delete_records(
    store: ObjectStore, data_key: str, count: int | None, key_of: Callable[[str, int], str], infix: str
) -> None:
    """Delete a data object's numbered records ``key_of(data_key, n)``: 1..``count``, or, with None, those a
    LIST of ``<data key><infix>`` finds."""
    if count is not None:
        found = [key_of(data_key, n) for n in range(1, count + 1)]
    else:
        found = [i.key for i in store.list(data_key + infix) if _record_owner(i.key, infix) == data_key]
    for key in found:
        store.delete(key)


def delete_part_frames(store: ObjectStore, data_key: str, count: int | None = None) -> None:
    """Delete a compressed data object's part frame records: parts 1..``count``, or, with None, those a LIST
    finds. The seal deletes them once the manifest holds the table; this finishes what a crash left."""
    _delete_records(store, data_key, count, keys.part_frames_key, keys.FRAMES_INFIX)


def delete_block_checksums(store: ObjectStore, data_key: str, count: int | None = None) -> None:
    """Delete a data object's block checksum records: ``count`` of them (1..count), or, with None, those a
    LIST finds."""
    _delete_records(store, data_key, count, keys.block_checksums_key, keys.CHECKSUMS_INFIX)
