"""A run of the offload job: it takes the writer lease of the store prefix (a new epoch), publishes
the policy in force, recovers every topic-partition from the store and starts on a fresh checkpoint; the
lease is renewed while it lasts, the policy republished when the file changes, retention runs beside it.

Part of :class:`~streamoffload.streaming.job.offload_job.OffloadJob` (``JobRuns``)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from streamoffload.checkpoints.control_requests import submit_requests
from streamoffload.checkpoints.lease import FencedError, WriterLease
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.retention import RetentionRunner
from streamoffload.pulsar.schema_registry import BrokerSchemaRegistry
from streamoffload.storage.base import StorageError
from streamoffload.storage.location import is_url
from streamoffload.streaming.governance.policy_versions import (
    PolicyLog,
    policy_document,
    write_versions_file,
)
from streamoffload.streaming.governance.quarantine import Quarantine
from streamoffload.streaming.job.queries import JobQueries
from streamoffload.streaming.job.state import Run
from streamoffload.streaming.job.tables import TableFigures, TableFollower
from streamoffload.streaming.segmenter.segmenter_model import (
    CONTROL_POLICY,
)

log = logging.getLogger(__name__)

METADATA_RELIST_S = 3600.0
"""How often the driver's periodic passes (retention, metrics) list a topic-partition the job's batches did not
change: for what other processes change (``cleanup``, ``delete``). Between those, a quiet topic-partition costs
no store request."""


class LeaseUnrenewableError(FencedError):
    """The run stopped itself: renewing its writer lease failed for most of its time to live (the store was
    unreachable), so it could not know it still held it. ``run_forever`` starts a new run, which takes the
    lease again unless another instance took it meanwhile."""


class JobRuns(JobQueries):
    """A run's lifecycle: lease, recovery, checkpoint, policy; and the retention beside it. Its query is
    ``JobQueries``'s."""

    def metadata(self) -> MetadataStore:
        return MetadataStore(self.location.open())

    def retention_runner(self) -> RetentionRunner:
        """Retention and metadata compaction, off the batch path (a thread of the lease holder). Told what the
        batches wrote, a pass lists only the topic-partitions that changed (and each other one hourly)."""
        if self.retention is None:
            self.retention = RetentionRunner(
                self.metadata(),
                self.policies.policy_for,
                interval_s=self.retention_interval_s,
                topics=lambda: list(self.last_topic_stats),
                relist_s=METADATA_RELIST_S,
            )
            self.metadata_listeners.append(self.retention.view.mark_changed)
        return self.retention

    def table_follower(self) -> TableFollower:
        """The run's Iceberg tables (``streaming.job.tables``): a follower per run, named after its epoch and
        fenced by its lease; told what each micro-batch sealed and, at first, every topic-partition the store
        holds."""
        run, lease = self.run, self.lease
        if run is None or lease is None:
            raise FencedError("the job has no run: call begin_run() first")
        if self.tables is None or self.tables.epoch != run.epoch:
            if self.tables is not None:
                self.tables.stop()
            follower = TableFollower(
                self.location,
                self.config.table,
                self.policies.policy_for,
                epoch=run.epoch,
                check_lease=lambda: self._check_lease(lease),
                keyring=self.config.encryption.keyring(),
                hooks=self.table_hooks,
                carried=self.table_figures(),
                schema_registry=BrokerSchemaRegistry(self.config.pulsar.service_url, self.config.pulsar.client),
            )
            follower.mark(run.resume)  # every topic-partition the store holds
            self.tables = follower
        return self.tables

    def _check_lease(self, lease: WriterLease) -> None:
        """``FencedError`` unless ``lease`` is still the run's and held (``TableFollower``'s check before commits)."""
        if self._fenced is not None:
            raise self._fenced
        if lease is not self.lease:
            raise FencedError(f"the run of epoch {lease.epoch} has ended; a later run writes the store")
        lease.check()

    def table_figures(self) -> list[TableFigures]:
        """Each table's figures as this process's followers saw them (carried from run to run; none before a sync)."""
        return [] if self.tables is None else self.tables.figures()

    def _metadata_changed(self, topics: Iterable[str]) -> None:
        topics = list(topics)
        if not topics:
            return
        for listener in self.metadata_listeners:
            try:
                listener(topics)
            except Exception:
                log.warning("metadata listener failed", exc_info=True)

    def open_segment_topics(self) -> list[str]:
        """Topic-partitions whose segmenter last reported an open segment (this run)."""
        return sorted(tp for tp, stats in self.last_topic_stats.items() if stats.open_segment)

    def begin_run(self) -> Run:
        """Take the writer lease (a new epoch), publish the policy, recover every topic-partition the
        store holds, and choose a fresh checkpoint. Raises ``LeaseHeldError`` when another instance
        writes the prefix."""
        scoped = self.location.open()
        self.lease = WriterLease(scoped, self.instance, ttl_ms=self.lease_ttl_ms)
        record = self.lease.acquire(force=self.force_lease)
        self.force_lease = False
        self._fenced = None
        config = self.policies.current()
        policy_log = PolicyLog(self.location, self.policy_refresh_s, self.policy_clock_skew_ms)
        versions = policy_log.start_run(config, int(time.time() * 1000))
        self.policy_effective_ms = versions[-1][0] if versions else 0
        self.quarantine = Quarantine(scoped, self._pause_file())
        self.quarantine.load()
        for paused, until_ms in sorted(self.quarantine.paused().items()):
            until = time.strftime("%H:%M:%S", time.localtime(until_ms / 1000))
            log.warning("%s: set aside after failing again and again; not offloaded until %s", paused, until)
        meta = MetadataStore(scoped)
        resume: dict[str, tuple[list[int] | None, int]] = {}
        recovered = meta.topics()
        for topic in recovered:
            point = meta.recover(topic)
            if point.next_ordinal:
                resume[str(topic)] = (list(point.last) if point.last else None, point.next_ordinal)
        self._metadata_changed(str(t) for t in recovered)  # recovery abandons attempts: list them again
        checkpoint = self._fresh_checkpoint(record.epoch)
        self.run = Run(record.epoch, resume, checkpoint, policy_log, policy_document(config))
        write_versions_file(self._versions_file(), versions)
        self.last_topic_stats = {}
        # A crash may have come between a commit and its acknowledgement: acknowledge from the store.
        self._hold_broker_retention({tp: last for tp, (last, _ordinal) in resume.items() if last})
        self._start_renewer()
        log.info("run %d: writer lease taken; %d topic-partitions resume from the store", record.epoch, len(resume))
        return self.run

    def _fresh_checkpoint(self, epoch: int) -> str:
        """``<checkpoint>/run-<epoch>``, removing earlier runs' (local) checkpoints: they hold nothing
        the store does not."""
        base = self.config.spark.checkpoint
        if is_url(base) and not base.startswith("file://"):
            return f"{base.rstrip('/')}/run-{epoch:08d}"
        root = Path(base.removeprefix("file://"))
        if root.is_dir():
            for child in root.iterdir():
                scratch = child.name.startswith(("run-", "spool-"))
                if scratch or child.name in ("offsets", "commits", "state", "sources"):
                    shutil.rmtree(child, ignore_errors=True)
            for name in ("metadata",):
                if (root / name).is_file():
                    (root / name).unlink()
        root.mkdir(parents=True, exist_ok=True)
        return str(root / f"run-{epoch:08d}")

    def _start_renewer(self) -> None:
        self._run_ended.clear()
        lease = self.lease
        assert lease is not None

        def renew() -> None:
            interval = max(lease.ttl_ms / 3000, 0.2)
            failing_since: float | None = None
            while not self._run_ended.wait(interval):
                try:
                    lease.renew()
                    failing_since = None
                except FencedError as err:
                    self._fence(err)
                    return
                except Exception as err:  # the store is unreachable: we cannot know we still hold it
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > lease.ttl_ms / 1000 * 0.8:
                        self._fence(LeaseUnrenewableError(f"cannot renew the writer lease: {err}"))
                        return
                    log.warning("renewing the writer lease failed (%s); retrying", err)

        self._renewer = threading.Thread(target=renew, name="streamoffload-lease", daemon=True)
        self._renewer.start()

    def _fence(self, err: FencedError) -> None:
        log.error("%s", err)
        self._fenced = err
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:
                log.debug("stopping the fenced query failed", exc_info=True)

    def end_run(self, *, release: bool = True) -> None:
        # The micro-batch still being written (overlap) ends first: its commits need the lease.
        failure = self.finish_writes()
        if failure is not None:
            log.warning("the run ended with a micro-batch's writes failed: %s", failure)
        if self.retention is not None:
            self.retention.stop()
        if self.tables is not None:
            self.tables.stop()
            if self.tables.on_batch in self.listeners:
                self.listeners.remove(self.tables.on_batch)
        self._run_ended.set()
        if self._renewer is not None:
            self._renewer.join(5)
            self._renewer = None
        if release and self.lease is not None and self._fenced is None:
            try:
                self.lease.release()
            except Exception:
                log.warning("releasing the writer lease failed", exc_info=True)
        self.run = None

    def watch_policy(self) -> bool:
        """Publish the policy again if the configuration file changed; True when it did."""
        run = self.run
        if run is None:
            return False
        config = self.policies.current()
        doc = policy_document(config)
        if doc == run.published:
            return False
        effective = run.policy_log.publish(config, int(time.time() * 1000))
        run.published = doc
        self.policy_effective_ms = effective
        if self.tables is not None:  # offloadTable may be on for more topics now
            self.tables.recheck()
        write_versions_file(self._versions_file(), run.policy_log.versions())
        # Open segments see a new version when their topic is next processed; without traffic that
        # could be the rollover time. A wake-up request makes the segmenter look again when it applies.
        open_topics = self.open_segment_topics()
        if open_topics:
            try:
                submit_requests(self.location.open(), open_topics, CONTROL_POLICY, effective_ms=effective)
            except StorageError as err:  # the version is published: segments see it at their next batch
                log.warning("offload policy published; asking the open segments to look now failed: %s", err)
        when = time.strftime("%H:%M:%S", time.localtime(effective / 1000))
        log.info("offload policy changed: in force from %s", when)
        return True

    def _watch_policy_or_retry(self) -> None:
        """``watch_policy`` in the running loop: a store that cannot take the new version now (a full disk,
        S3 failing) is not the job's end; the edit is published at a later second, and said so once per cause."""
        try:
            self.watch_policy()
            self._policy_failure = None
        except StorageError as err:
            if self._policy_failure != str(err):
                log.warning("publishing the edited offload policy failed (%s); retrying every second", err)
            self._policy_failure = str(err)
