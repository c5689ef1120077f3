"""What the offload job's parts share: the state :class:`~streamoffload.streaming.job.offload_job.OffloadJob`
sets up (``OffloadJob.__init__``) and its query (``JobQueries``), its runs (``JobRuns``) and their supervision
(``JobSupervision``) read and set, declared once with its types, with what one part calls of a part above it;
and :class:`Run`, one run of the job."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamoffload.checkpoints.lease import FencedError, WriterLease
from streamoffload.checkpoints.retention import RetentionRunner
from streamoffload.config import Config, PolicySource
from streamoffload.streaming.governance.policy_versions import PolicyLog
from streamoffload.streaming.governance.quarantine import Quarantine
from streamoffload.streaming.handoff.actions import StatsAction
from streamoffload.streaming.job.health import HealthTracker
from streamoffload.streaming.job.report import BatchListener
from streamoffload.streaming.job.tables import TableFollower
from streamoffload.streaming.sink.entry_fetch import BrokerFetcherSpec
from streamoffload.streaming.sink.pipeline import SinkPipeline

if TYPE_CHECKING:
    from streamoffload.table.sync import SyncHooks


@dataclass
class Run:
    """One run of the job: a lease epoch, where each topic-partition continues, a fresh checkpoint."""

    epoch: int
    resume: dict[str, tuple[list[int] | None, int]]
    checkpoint: str
    policy_log: PolicyLog
    published: dict[str, Any]
    """The policy document last published."""


class JobState:
    """The offload job's state, declared for its parts (only annotations: the values are ``OffloadJob``'s), and
    the methods ``JobQueries`` calls that ``JobRuns`` (above it in ``OffloadJob``'s bases) defines."""

    config: Config
    config_path: str | None
    policies: PolicySource
    listeners: list[BatchListener]
    """Told each micro-batch's report."""
    metadata_listeners: list[Callable[[Iterable[str]], None]]
    """Told which topic-partitions' metadata the job wrote (each batch's, and every recovered one at a run's
    start): the driver's periodic passes (retention, metrics) list only those again."""
    query: Any
    """The running Spark ``StreamingQuery``, None before the first ``start``."""
    _stop: threading.Event
    retention: RetentionRunner | None
    tables: TableFollower | None
    """The run's Iceberg tables (``JobRuns.table_follower``), made at its first use in a run."""
    table_hooks: SyncHooks | None
    """The tests' crash points and other writers in the tables' syncs (None: none)."""
    last_topic_stats: dict[str, StatsAction]
    """The segmenter's latest figures per topic-partition (see BatchReport.topics)."""
    retention_interval_s: float
    instance: str
    """Who this job is to the writer lease: a restart of the same instance takes its lease at once."""
    lease_ttl_ms: int
    policy_refresh_s: float
    policy_clock_skew_ms: int
    force_lease: bool
    """Take the writer lease at the next run's start even if another instance holds it (once)."""
    run: Run | None
    lease: WriterLease | None
    _fenced: FencedError | None
    """Why the run lost its writer lease, once it has."""
    _renewer: threading.Thread | None
    _run_ended: threading.Event
    quarantine: Quarantine | None
    rate_limit_tasks: int
    spark_master: str | None
    """The master the query runs on (``spark.sparkContext.master``), set when it is built; before, ``[spark] master``
    is."""
    _pipeline: SinkPipeline | None
    """The run's sink pipeline with overlap (``JobQueries._sink_pipeline``), None before its first micro-batch."""
    _fetcher_spec: tuple[int | None, BrokerFetcherSpec] | None
    """How the sink fetches entries (``JobQueries.fetcher_spec``), for the run of which epoch."""
    """Tasks that share the job's total rate limits: Spark's parallelism, set when the query is built."""
    failed_topics: dict[str, str]
    """Topics that failed during ``run_once`` and were set aside, with why (the run then fails)."""
    _policy_failure: str | None
    """Why publishing the edited policy last failed (said once per cause)."""
    policy_effective_ms: int
    """When the newest offload policy version this job published takes effect (its metrics show it)."""
    health: HealthTracker
    """What ``run_forever`` does about an unreachable broker (status and metrics show it)."""
    progress_dir: str | None
    """Where the sink's tasks write what they have written so far (``streaming.runtime.progress_files``; None:
    nowhere): ``run --once``'s bars on a terminal set it (``JobQueries.progress_files_dir``)."""

    def begin_run(self) -> Run:
        """Start a run (``JobRuns.begin_run``)."""
        raise NotImplementedError

    def retention_runner(self) -> RetentionRunner:
        """The run's retention, made once (``JobRuns.retention_runner``)."""
        raise NotImplementedError

    def table_follower(self) -> TableFollower:
        """The run's Iceberg tables (``JobRuns.table_follower``)."""
        raise NotImplementedError

    def _metadata_changed(self, topics: Iterable[str]) -> None:
        """Tell ``metadata_listeners`` which topic-partitions' metadata changed (``JobRuns._metadata_changed``)."""
        raise NotImplementedError
