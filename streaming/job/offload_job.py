"""The offload job: Pulsar source + control requests -> segmenter (transformWithState) ->
sink (foreachBatch; its writes on a driver thread while the next micro-batch reads), with retention on the driver.

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

from streamoffload.checkpoints.lease import DEFAULT_TTL_MS, instance_id
from streamoffload.config import Config, PolicySource
from streamoffload.streaming.governance.policy_versions import CLOCK_SKEW_MS, DEFAULT_REFRESH_S
from streamoffload.streaming.job.health import HealthTracker
from streamoffload.streaming.job.queries import JobQueries
from streamoffload.streaming.job.runs import JobRuns
from streamoffload.streaming.job.supervision import JobSupervision


class OffloadJob(JobSupervision, JobRuns, JobQueries):
    """The offload job: its query (``JobQueries``, ``streaming/job/queries.py``), its runs (``JobRuns``,
    ``streaming/job/runs.py``) and their supervision (``JobSupervision``, ``streaming/job/supervision.py``)."""

    def __init__(self, config: Config, config_path: str | None = None, *, instance: str | None = None) -> None:
        # The state its parts share, declared with its types and meanings in ``JobState`` (streaming/job/state.py).
        self.config = config
        self.config_path = config_path
        self.policies = PolicySource(config, config_path)
        self.listeners = []
        self.metadata_listeners = []
        self.query = None
        self._stop = threading.Event()
        self.retention = None
        self.tables = None
        self.table_hooks = None
        self.last_topic_stats = {}
        self.retention_interval_s = 60.0
        self.instance = instance or instance_id(config.spark.checkpoint)
        self.lease_ttl_ms = DEFAULT_TTL_MS
        self.policy_refresh_s = DEFAULT_REFRESH_S
        self.policy_clock_skew_ms = CLOCK_SKEW_MS
        self.force_lease = False
        self.run = None
        self.lease = None
        self._fenced = None
        self._renewer = None
        self._run_ended = threading.Event()
        self.quarantine = None
        self._fetcher_spec = None
        self._pipeline = None
        self.rate_limit_tasks = 1
        self.spark_master = None
        self.failed_topics = {}
        self._policy_failure = None
        self.policy_effective_ms = 0
        self.health = HealthTracker(None, config.pulsar.service_url)
        self.progress_dir = None
