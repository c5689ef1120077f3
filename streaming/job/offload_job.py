"""The offload job: Pulsar source + control requests -> segmenter (transformWithState) ->
sink (foreachBatch, uploads on executors), with retention on the driver.

``OffloadJob.run_forever`` is the continuously running service; ``OffloadJob.run_once`` drains what is
available, seals every open segment and returns (batch-style runs, tests, checks).

The store is the source of truth. Every **run** (a start, and every restart after a failure) takes the
writer lease of the store prefix (a new epoch), publishes the policy in force, recovers each
topic-partition from the store (``MetadataStore.recover``: continue after the last committed segment,
abandon unfinished attempts) and starts its queries on a fresh Spark checkpoint under
``<checkpoint>/run-<epoch>``: Spark's checkpoint is scratch space for one run, so losing it, replacing
it or restoring an old one changes nothing. What a crash costs is the open segments' entries, read
again from the broker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from streamoffload.checkpoints.lease import DEFAULT_TTL_MS, FencedError, WriterLease, instance_id
from streamoffload.checkpoints.retention import RetentionRunner
from streamoffload.config import Config, PolicySource
from streamoffload.streaming.control.policy_versions import CLOCK_SKEW_MS, DEFAULT_REFRESH_S
from streamoffload.streaming.control.quarantine import Quarantine
from streamoffload.streaming.job.health import HealthTracker
from streamoffload.streaming.job.queries import BatchListener, JobQueries
from streamoffload.streaming.job.runs import JobRuns, Run
from streamoffload.streaming.job.supervision import JobSupervision
from streamoffload.streaming.sink.entry_fetch import BrokerFetcherSpec


class OffloadJob(JobSupervision, JobRuns, JobQueries):
    """The offload job: its query (``JobQueries``, ``streaming/job/queries.py``), its runs (``JobRuns``,
    ``streaming/job/runs.py``) and their supervision (``JobSupervision``, ``streaming/job/supervision.py``)."""

    def __init__(self, config: Config, config_path: str | None = None, *, instance: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.policies = PolicySource(config, config_path)
        self.listeners: list[BatchListener] = []
        self.metadata_listeners: list[Callable[[Iterable[str]], None]] = []
        """Told which topic-partitions' metadata the job wrote (each batch's, and every recovered one at a
        run's start): the driver's periodic passes (retention, metrics) list only those again."""
        self.query: Any = None
        self._stop = threading.Event()
        self.retention: RetentionRunner | None = None
        self.last_topic_stats: dict[str, dict[str, Any]] = {}
        """The segmenter's latest figures per topic-partition (see BatchReport.topics)."""
        self.retention_interval_s = 60.0
        self.instance = instance or instance_id(config.spark.checkpoint)
        """Who this job is to the writer lease: a restart of the same instance takes its lease at once."""
        self.lease_ttl_ms = DEFAULT_TTL_MS
        self.policy_refresh_s = DEFAULT_REFRESH_S
        self.policy_clock_skew_ms = CLOCK_SKEW_MS
        self.force_lease = False
        self.run: Run | None = None
        self.lease: WriterLease | None = None
        self._fenced: FencedError | None = None
        self._renewer: threading.Thread | None = None
        self._run_ended = threading.Event()
        self.quarantine: Quarantine | None = None
        self._fetcher_spec: tuple[int | None, BrokerFetcherSpec] | None = None
        self.rate_limit_tasks = 1
        """Tasks that share the job's total rate limits: Spark's parallelism, set when the query is built."""
        self.failed_topics: dict[str, str] = {}
        """Topics that failed during ``run_once`` and were set aside, with why (the run then fails)."""
        self._policy_failure: str | None = None
        self.health = HealthTracker(None, config.pulsar.service_url)
        """What ``run_forever`` does about an unreachable broker (status and metrics show it)."""
