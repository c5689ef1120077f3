"""Retention: mark offloaded ledgers deleted by age or total size, then delete the segments whose
ledgers are all marked, once the deletion lag has passed (PIP-76 "how to delete").

``RetentionRunner`` runs it off the job's batch path, in its own thread, on a ``MetadataView``: a pass
lists each topic-partition's ``_meta/`` once and reads only what changed since the last pass, then
compacts the metadata the deletions left (``MetadataView.compact``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore, now_ms
from streamoffload.checkpoints.metadata_view import KEEP_RECENT, CompactionReport, MetadataView
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.units import MIB

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    marked_ledgers: list[int] = field(default_factory=list)
    deleted_segments: list[str] = field(default_factory=list)
    compaction: CompactionReport | None = None


def apply_retention(
    meta: MetadataStore,
    topic: str,
    policy: OffloadPolicy,
    at_ms: int | None = None,
    *,
    view: MetadataView | None = None,
) -> RetentionReport:
    """Mark ledgers past the retention time or beyond the retention size, then delete what may go.

    The newest offloaded ledger is never marked: it may still be receiving entries, and marking it
    would eventually delete data written after the mark. With ``view`` (kept between passes), the pass
    lists the topic's metadata once and reads only what changed since the view last looked (or, with the
    view's ``relist_s``, lists it only when it was marked changed: ``MetadataView.snapshot``)."""
    at = now_ms() if at_ms is None else at_ms
    view = MetadataView(meta) if view is None else view
    report = RetentionReport()
    snap = view.snapshot(topic)
    if policy.retentionTimeInMinutes >= 0 or policy.retentionSizeInMB >= 0:
        deleted = dict(snap.marks)
        # Per ledger: newest publish (or offload) time and bytes, over the segments holding it.
        ledgers = snap.ledgers()
        newest = {lid: ledger.newest_ms for lid, ledger in ledgers.items()}
        size = {lid: ledger.size for lid, ledger in ledgers.items()}
        closed = sorted(newest)[:-1]
        live = [lid for lid in closed if lid not in deleted]
        if policy.retentionTimeInMinutes >= 0:
            horizon = at - int(policy.retentionTimeInMinutes * 60_000)
            for lid in live:
                if newest[lid] < horizon and view.mark_ledger_deleted(topic, lid, "retention-time", at):
                    report.marked_ledgers.append(lid)
        if policy.retentionSizeInMB >= 0:
            limit = int(policy.retentionSizeInMB * MIB)
            marked = set(deleted) | set(report.marked_ledgers)
            total = sum(size[lid] for lid in newest if lid not in marked)
            for lid in live:
                if total <= limit:
                    break
                if lid in marked:
                    continue
                if view.mark_ledger_deleted(topic, lid, "retention-size", at):
                    report.marked_ledgers.append(lid)
                total -= size[lid]
    for seg in view.apply_deletions(topic, policy.managedLedgerOffloadDeletionLagMs, at):
        report.deleted_segments.append(str(mf.manifest_uuid(seg)))
    return report


@dataclass
class PassReport:
    """What one ``RetentionRunner.run_pass`` did, per topic-partition (topics where nothing happened are
    left out), and the topics that failed (with why)."""

    topics: dict[str, RetentionReport] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    temporaries_removed: int = 0
    seconds: float = 0.0


class RetentionRunner:
    """Retention and metadata compaction of every topic-partition of a store, off the job's batch path.

    ``run_pass()`` does one pass (the job's batch runs call it at their end); ``start()`` runs a pass every
    ``interval_s`` in a daemon thread until ``stop()``. A pass costs one listing per topic-partition plus
    reads of what changed (``MetadataView``); the whole store is listed only to discover topic-partitions,
    at the first pass and every ``rediscover_s``, and ``topics`` (e.g. the job's configured topics and the
    topic-partitions of its batches) adds the ones it should not wait for. With ``relist_s`` (the job, which
    tells ``view.mark_changed`` what its batches wrote) a pass lists only the topic-partitions that changed,
    and each of the others once every ``relist_s``: an idle pass costs no request.

    ``grace_ms`` protects work in flight from compaction (failure notes) and from the filesystem store's
    sweep of stale temporaries, done every ``temporaries_interval_s`` (0: never) on stores that have one.
    A topic-partition whose pass fails is logged and retried at the next pass; the others go on. The view
    holds each topic-partition's newest ``keep_recent`` segments and folds the older ones into sums
    (``MetadataView``), so the runner's memory does not grow with the store's history."""

    def __init__(
        self,
        meta: MetadataStore,
        policy_for: Callable[[str], OffloadPolicy],
        *,
        interval_s: float = 60.0,
        topics: Callable[[], Iterable[str]] | None = None,
        rediscover_s: float = 3600.0,
        relist_s: float | None = None,
        grace_ms: int = 3_600_000,
        temporaries_interval_s: float = 3600.0,
        keep_recent: int | None = KEEP_RECENT,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.meta = meta
        self.policy_for = policy_for
        self.interval_s = interval_s
        self.extra_topics = topics
        self.grace_ms = grace_ms
        self.temporaries_interval_s = temporaries_interval_s
        self.clock = clock
        self.view = MetadataView(meta, rediscover_s=rediscover_s, relist_s=relist_s, keep_recent=keep_recent)
        self.passes = 0
        self.last_report: PassReport | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None

    def run_pass(self, at_ms: int | None = None) -> PassReport:
        """Retention, deletions and compaction of every known topic-partition, now (or at ``at_ms``)."""
        with self._lock:
            started = time.monotonic()
            at = self.clock() if at_ms is None else at_ms
            out = PassReport()
            extra: list[str] = []
            if self.extra_topics is not None:
                try:
                    extra = [str(t) for t in self.extra_topics()]
                except Exception as err:
                    log.warning("retention: listing the job's topics failed: %s", err)
            for name in self.view.topics(extra):
                try:
                    report = apply_retention(self.meta, name, self.policy_for(name), at, view=self.view)
                    compaction = self.view.compact(name, grace_ms=self.grace_ms, at_ms=at)
                except Exception as err:
                    log.warning("retention failed for %s", name, exc_info=True)
                    out.errors[name] = f"{type(err).__name__}: {err}"
                    continue
                if compaction.total:
                    report.compaction = compaction
                if report.marked_ledgers or report.deleted_segments or report.compaction:
                    out.topics[name] = report
                    log.info(
                        "retention on %s: marked ledgers %s deleted, deleted segments %s%s",
                        name,
                        report.marked_ledgers,
                        report.deleted_segments,
                        f", compacted {compaction}" if compaction.total else "",
                    )
            out.temporaries_removed = self._sweep()
            out.seconds = time.monotonic() - started
            self.passes += 1
            self.last_report = out
            return out

    def _sweep(self) -> int:
        sweep = getattr(self.meta.store, "remove_stale_temporaries", None)
        if sweep is None or self.temporaries_interval_s <= 0:
            return 0
        now = time.monotonic()
        if self._last_sweep is not None and now - self._last_sweep < self.temporaries_interval_s:
            return 0
        self._last_sweep = now
        try:
            return int(sweep(older_than=self.grace_ms / 1000))
        except Exception:
            log.warning("retention: removing stale temporaries failed", exc_info=True)
            return 0

    # -- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Run a pass every ``interval_s`` in a daemon thread (the first one after ``interval_s``)."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="streamoffload-retention", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next pass now."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (waiting for a pass under way to finish). Idempotent."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.run_pass()
            except Exception:  # run_pass logs per topic; this is discovery failing (an unreachable store)
                log.warning("retention pass failed", exc_info=True)
