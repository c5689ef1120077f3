"""Checking a topic-partition's offload history as a whole, and every Offloaded segment of it.

Every manifest decodes (checksum frame, required fields, known status: ``CorruptManifest`` names its key) and
stands where it was written (its topic and keys those of its place: ``MisplacedManifest``, ``MisplacedCommit``);
every place of the history (``_meta/commits/<ordinal>``) from the first one still offloaded is held by an
Offloaded segment or a deletion record (``MissingSegment``, ``GapInHistory``); consecutive places follow each
other within a ledger (``GapBetweenSegments``, ``OverlappingSegments``); Failed attempts (``FailedSegment``)
and Assigned ones that are superseded or older than the staleness age (``StaleSegment``) are problems. A
topic whose segments were all deleted (deletion records or commits remain) is fine; one with nothing at all
is ``NoSegments``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Protocol

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.deleted_segments import DeletedRecord
from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.read.verify.segment import Problem, SegmentReport, verify_segment
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectNotFoundError, ObjectStore
from streamoffload.storage.location import ScopedStore


@dataclass
class TopicReport:
    topic: str
    segments: list[SegmentReport] = field(default_factory=list)
    unfinished: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    """Problems that belong to no one segment (manifests that do not decode, overlaps, no segments)."""

    @property
    def all_problems(self) -> list[Problem]:
        return self.problems + [p for s in self.segments for p in s.problems]


STALE_MINUTES = 60.0
"""An Assigned segment older than this is reported as stale (a live job seals or abandons its open
segments well within it)."""


@dataclass
class _Known:
    """A segment the topic's history accounts for: committed, offloaded or deleted."""

    ordinal: int | None
    segment: str
    start: tuple[int, int]
    end: tuple[int, int]
    key: str


def _trusted(data: bytes, key: str, prefix: str, topic: TopicName) -> SegmentManifest:
    """The manifest (or commit) at ``key``, decoded and checked against its place (``mf.check_place``)."""
    return mf.check_place(mf.decode_manifest(data, where=key), key=key, prefix=prefix, topic=topic)


def _pos(p: tuple[int, int]) -> str:
    return f"{p[0]}:{p[1]}"


class VerifyProgress(Protocol):
    """Told how far a check is (the ``verify`` command's progress bar)."""

    def listed(self, segments: int, data_bytes: int) -> None:
        """A topic-partition's Offloaded segments were listed: this many, of this many data bytes."""

    def checked(self, segment: SegmentReport, data_bytes: int) -> None:
        """One of them was checked; ``data_bytes``: its manifest's data length (what ``listed`` counted)."""


def verify_topic(
    scoped: ScopedStore,
    topic: TopicName,
    *,
    crc: bool = False,
    stale_ms: float = STALE_MINUTES * 60_000,
    now_ms: int | None = None,
    keyring: KeyRing | None = None,
    progress: VerifyProgress | None = None,
) -> TopicReport:
    """Verify every Offloaded segment of ``topic`` and the topic's history as a whole.

    Beyond each segment's objects: manifests that do not decode (checksum, required fields, status);
    overlapping segments; gaps (a place of the history, ``_meta/commits/<ordinal>``, that no Offloaded
    segment, deletion record or commit accounts for; consecutive places whose positions do not follow
    within a ledger); commits that disagree with the manifests; Failed attempts and stale Assigned ones
    (superseded, or older than ``stale_ms``). A topic whose segments were all deleted is fine; one with
    nothing at all is ``NoSegments``."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    check = _TopicCheck(scoped.store, scoped.prefix, topic, TopicReport(str(topic)))
    offloaded, unfinished = check.read_manifests()
    commits = check.read_commits()
    deleted = check.read_deletions()
    failed_ids = check.failure_notes()
    marks = check.deleted_ledgers()
    if progress is not None:
        progress.listed(len(offloaded), sum(m.dataLength for m, _ in offloaded))
    check.check_offloaded(offloaded, commits, crc=crc, keyring=keyring, progress=progress)
    live = {m.ordinal: (m, key) for m, key in reversed(offloaded)}
    by_ordinal = _places(commits, deleted, live)
    check.check_missing(commits, live, set(deleted))
    if live:
        check.check_gaps(by_ordinal, live, marks)
        check.check_neighbours(by_ordinal, live)
    check.check_unfinished(unfinished, by_ordinal, failed_ids, now_ms=now, stale_ms=stale_ms)
    if not check.listed_anything:
        check.problem(check.manifests_prefix, "NoSegments", "no segment manifests for this topic-partition")
    return check.report


_Placed = tuple[SegmentManifest, str]
"""A manifest and its key."""


def _places(commits: dict[int, _Known], deleted: dict[str, _Known], live: dict[int, _Placed]) -> dict[int, _Known]:
    """What holds each place of the history: its Offloaded segment, else its commit, else its deletion record."""
    by_ordinal: dict[int, _Known] = {}
    for ordinal, commit in commits.items():
        by_ordinal[ordinal] = commit
    for known in deleted.values():
        if known.ordinal is not None:
            by_ordinal.setdefault(known.ordinal, known)
    for ordinal, (m, key) in live.items():
        by_ordinal[ordinal] = _Known(ordinal, str(mf.manifest_uuid(m)), mf.start_position(m), mf.end_position(m), key)
    return by_ordinal


@dataclass
class _TopicCheck:
    """One topic-partition's check, step by step: each step reads one kind of record or checks one rule, and
    adds what it finds to ``report``."""

    store: ObjectStore
    prefix: str
    topic: TopicName
    report: TopicReport
    listed_anything: bool = False

    @property
    def manifests_prefix(self) -> str:
        return keys.manifests_prefix(self.prefix, self.topic)

    def problem(
        self, obj: str, error: str, message: str, segment: str | None = None, offset: int | None = None
    ) -> None:
        self.report.problems.append(Problem(obj, offset, error, message, self.report.topic, segment))

    def read_manifests(self) -> tuple[list[_Placed], list[_Placed]]:
        """The Offloaded manifests and the unfinished ones, strictly decoded, in key order."""
        offloaded: list[_Placed] = []
        unfinished: list[_Placed] = []
        for info in self.store.list(self.manifests_prefix):
            self.listed_anything = True
            try:
                manifest = _trusted(self.store.get(info.key), info.key, self.prefix, self.topic)
            except ObjectNotFoundError:
                continue
            except mf.MisplacedManifestError as err:
                self.problem(info.key, "MisplacedManifest", err.reason)
                continue
            except FormatError as err:
                self.problem(info.key, "CorruptManifest", err.reason, offset=err.offset)
                continue
            except StreamOffloadError as err:
                self.problem(info.key, "CorruptManifest", str(err))
                continue
            (offloaded if manifest.status == mf.OFFLOADED else unfinished).append((manifest, info.key))
        return offloaded, unfinished

    def read_commits(self) -> dict[int, _Known]:
        """The commits: one per place of the topic's history."""
        commits: dict[int, _Known] = {}
        for info in self.store.list(keys.commits_prefix(self.prefix, self.topic)):
            self.listed_anything = True
            try:
                ordinal = keys.parse_commit_name(info.key)
            except ValueError:
                continue
            try:
                held = _trusted(self.store.get(info.key), info.key, self.prefix, self.topic)
            except ObjectNotFoundError:
                continue
            except mf.MisplacedManifestError as err:
                self.problem(info.key, "MisplacedCommit", err.reason)
                commits[ordinal] = _Known(ordinal, "", (-1, -1), (-1, -1), info.key)  # the place is taken
                continue
            except FormatError as err:
                self.problem(info.key, "CorruptCommit", err.reason, offset=err.offset)
                commits[ordinal] = _Known(ordinal, "", (-1, -1), (-1, -1), info.key)  # the place is taken
                continue
            if held.ordinal != ordinal:
                self.problem(
                    info.key, "CorruptCommit", f"commit of place {ordinal} holds segment of place {held.ordinal}"
                )
            commits[ordinal] = _Known(
                ordinal, str(mf.manifest_uuid(held)), mf.start_position(held), mf.end_position(held), info.key
            )
        return commits

    def read_deletions(self) -> dict[str, _Known]:
        """The deletion records (retention, delete-ledger), by segment id."""
        deleted: dict[str, _Known] = {}
        for info in self.store.list(keys.topic_dir(self.prefix, self.topic) + keys.DELETED_SEGMENTS_DIR + "/"):
            self.listed_anything = True
            try:
                record = DeletedRecord.decode(self.store.get(info.key), where=info.key)
            except ObjectNotFoundError:
                continue
            except FormatError as err:
                self.problem(info.key, "CorruptDeletionRecord", err.reason, offset=err.offset)
                continue
            deleted[record.segment_id] = _Known(record.ordinal, record.segment_id, record.start, record.end, info.key)
        return deleted

    def failure_notes(self) -> dict[str, str]:
        """The failure notes: segment id to the note's key."""
        failures_prefix = keys.failures_prefix(self.prefix, self.topic)
        return {info.key[len(failures_prefix) :]: info.key for info in self.store.list(failures_prefix)}

    def deleted_ledgers(self) -> set[int]:
        """The ledgers marked deleted (by retention or delete-ledger)."""
        return {
            ledger
            for info in self.store.list(keys.deleted_marks_prefix(self.prefix, self.topic))
            for ledger in _mark_ledger(info.key)
        }

    def check_offloaded(
        self,
        offloaded: list[_Placed],
        commits: dict[int, _Known],
        *,
        crc: bool,
        keyring: KeyRing | None,
        progress: VerifyProgress | None = None,
    ) -> None:
        """Each Offloaded segment: its objects, its place among its neighbours, its commit."""
        previous: _Placed | None = None
        for manifest, key in offloaded:
            seg_id = str(mf.manifest_uuid(manifest))
            if previous is not None and mf.start_position(manifest) <= mf.end_position(previous[0]):
                s, e = mf.start_position(manifest), mf.end_position(previous[0])
                self.problem(
                    key,
                    "OverlappingSegments",
                    f"segment starts at {_pos(s)}, before the previous segment ({previous[1]}) ends at {_pos(e)}",
                    seg_id,
                )
            previous = (manifest, key)
            commit = commits.get(manifest.ordinal)
            if commit is None:
                self.problem(
                    key,
                    "UncommittedSegment",
                    f"Offloaded segment of place {manifest.ordinal} has no commit "
                    f"{keys.commit_key(self.prefix, self.topic, manifest.ordinal)}",
                    seg_id,
                )
            elif commit.segment and commit.segment != seg_id:
                self.problem(
                    key,
                    "ConflictingCommit",
                    f"Offloaded segment {seg_id} of place {manifest.ordinal}, but the commit {commit.key} holds "
                    f"segment {commit.segment}",
                    seg_id,
                )
            self.report.segments.append(
                verify_segment(
                    self.store,
                    manifest.dataKey,
                    manifest.indexKey,
                    crc=crc,
                    manifest=manifest,
                    manifest_key=key,
                    topic=self.report.topic,
                    keyring=keyring,
                )
            )
            if progress is not None:
                progress.checked(self.report.segments[-1], manifest.dataLength)

    def check_missing(self, commits: dict[int, _Known], live: dict[int, _Placed], deleted_ids: set[str]) -> None:
        """Each committed place holds an Offloaded segment or a deleted one (``MissingSegment``)."""
        for ordinal, commit in sorted(commits.items()):
            if ordinal in live or not commit.segment or commit.segment in deleted_ids:
                continue
            self.problem(
                commit.key,
                "MissingSegment",
                f"place {ordinal} of the history was committed to segment {commit.segment} "
                f"({_pos(commit.start)}..{_pos(commit.end)}), which has no Offloaded manifest and no deletion "
                f"record: its entries cannot be read",
                commit.segment,
            )

    def check_gaps(self, by_ordinal: dict[int, _Known], live: dict[int, _Placed], marks: set[int]) -> None:
        """Every place from the first one still offloaded (earlier ones may have gone to retention, their
        commits compacted) to the newest one is offloaded, deleted, or at least committed (``GapInHistory``)."""
        first = min(live)
        last = max(by_ordinal)
        for ordinal in range(first, last + 1):
            if ordinal in by_ordinal:
                continue
            before = max((o for o in by_ordinal if o < ordinal), default=None)
            after = min((o for o in by_ordinal if o > ordinal), default=None)
            lo = by_ordinal[before].end if before is not None else None
            hi = by_ordinal[after].start if after is not None else None
            if (
                lo is not None
                and hi is not None
                and lo[0] >= 0
                and hi[0] >= 0
                and any(lo[0] <= ledger <= hi[0] for ledger in marks)
            ):
                continue  # deleted by retention or delete-ledger, its records compacted away
            where = keys.commit_key(self.prefix, self.topic, ordinal)
            span = f" (between {_pos(lo)} and {_pos(hi)})" if lo is not None and hi is not None else ""
            self.problem(
                where,
                "GapInHistory",
                f"place {ordinal} of the history is missing: no commit, no Offloaded segment, no deletion record{span}",
            )

    def check_neighbours(self, by_ordinal: dict[int, _Known], live: dict[int, _Placed]) -> None:
        """Consecutive places follow each other within a ledger (``GapBetweenSegments``, ``OverlappingSegments``)."""
        for (o1, a), (o2, b) in itertools.pairwise(sorted(by_ordinal.items())):
            if o2 != o1 + 1 or a.end[0] < 0 or b.start[0] < 0:
                continue
            if o1 in live and o2 in live and b.start <= a.end:
                continue  # reported by check_offloaded, by manifest
            if b.start[0] == a.end[0] and b.start[1] != a.end[1] + 1:
                kind = "GapBetweenSegments" if b.start[1] > a.end[1] + 1 else "OverlappingSegments"
                self.problem(
                    b.key,
                    kind,
                    f"place {o2} starts at {_pos(b.start)}, but place {o1} ({a.key}) ends at {_pos(a.end)}: "
                    + (
                        f"entries {a.end[1] + 1}..{b.start[1] - 1} of ledger {a.end[0]} are in no segment"
                        if kind == "GapBetweenSegments"
                        else "they overlap"
                    ),
                    b.segment,
                )
            elif b.start < a.end:
                self.problem(
                    b.key,
                    "OverlappingSegments",
                    f"place {o2} starts at {_pos(b.start)}, before place {o1} ({a.key}) ends at {_pos(a.end)}",
                    b.segment,
                )

    def check_unfinished(
        self,
        unfinished: list[_Placed],
        by_ordinal: dict[int, _Known],
        failed_ids: dict[str, str],
        *,
        now_ms: int,
        stale_ms: float,
    ) -> None:
        """Unfinished attempts: Failed ones always, Assigned ones once superseded or stale."""
        newest_end = max((k.end for k in by_ordinal.values() if k.end[0] >= 0), default=None)
        for manifest, key in unfinished:
            seg_id = str(mf.manifest_uuid(manifest))
            failed = manifest.status == mf.FAILED or seg_id in failed_ids
            status = "Failed" if failed else mf.STATUS_NAMES[manifest.status]
            self.report.unfinished[status] = self.report.unfinished.get(status, 0) + 1
            start = mf.start_position(manifest)
            holder = by_ordinal.get(manifest.ordinal)
            age_ms = now_ms - manifest.assignedTimestamp if manifest.HasField("assignedTimestamp") else None
            if failed:
                why = manifest.failure if manifest.status == mf.FAILED else ""
                self.problem(
                    key,
                    "FailedSegment",
                    f"attempt at place {manifest.ordinal} from {_pos(start)} failed"
                    + (f": {why}" if why else f" (see {failed_ids[seg_id]})" if seg_id in failed_ids else "")
                    + "; the job's next run abandons it and reads its entries again, cleanup removes it",
                    seg_id,
                )
            elif (holder is not None and holder.segment and holder.segment != seg_id) or (
                newest_end is not None and start <= newest_end
            ):
                self.problem(
                    key,
                    "StaleSegment",
                    f"Assigned attempt at place {manifest.ordinal} from {_pos(start)} is superseded by a committed "
                    "segment; cleanup removes it",
                    seg_id,
                )
            elif age_ms is not None and age_ms > stale_ms:
                self.problem(
                    key,
                    "StaleSegment",
                    f"Assigned attempt at place {manifest.ordinal} from {_pos(start)} has been open for "
                    f"{age_ms / 60_000:.0f} minutes (more than {stale_ms / 60_000:g}): no job is finishing it",
                    seg_id,
                )


def _mark_ledger(key: str) -> list[int]:
    try:
        return [keys.parse_deleted_mark(key)]
    except ValueError:
        return []
