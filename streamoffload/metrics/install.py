"""Attaching metrics to a running offload job: the batch listener, the Spark progress listener, the
refresher thread and the HTTP endpoint, all undone by ``JobMetrics.stop()``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import Config
from streamoffload.metrics.collector import JobMetrics
from streamoffload.metrics.model import BacklogProvider
from streamoffload.metrics.sources import backlog_file_provider, progress_listener

if TYPE_CHECKING:
    from streamoffload.streaming.job.health import HealthTracker
    from streamoffload.streaming.job.report import BatchListener


class MetricsJob(Protocol):
    """What metrics need of a job (``streaming.job.offload_job.OffloadJob`` is one): its events, its store and
    its configuration."""

    @property
    def config(self) -> Config: ...

    @property
    def listeners(self) -> list[BatchListener]:
        """Told each micro-batch's report."""

    @property
    def metadata_listeners(self) -> list[Callable[[Iterable[str]], None]] | None:
        """Told which topic-partitions' metadata the job wrote; None: a job that does not tell (every store
        refresh then lists every topic-partition)."""

    @property
    def health(self) -> HealthTracker | None:
        """Broker reachability and restarts; None: not known."""

    def metadata(self) -> MetadataStore: ...

    def source_options(self) -> dict[str, str]: ...


def install_metrics(
    job: MetricsJob,
    spark: Any,
    address: str,
    *,
    store_refresh_s: float = 60.0,
    backlog_interval_s: float = 15.0,
    backlog: BacklogProvider | None = None,
    topic_series: int | None = None,
) -> JobMetrics:
    """Attach metrics to an :class:`~streamoffload.streaming.job.offload_job.OffloadJob`: read the store's
    metadata, register the batch listener and a ``StreamingQueryListener`` on ``spark``, start the
    refresher and serve ``/metrics`` on ``address``. ``JobMetrics.stop()`` undoes all of it.

    Latest positions come from Spark's progress events. ``backlog`` adds a provider: by default the
    source's ``backlogFile`` when the job's source options name one (it adds bytes behind), or pass
    :func:`pulsar_backlog` to ask the broker directly (one short-lived subscription per partition
    and probe).

    ``topic_series`` (by default the job configuration's ``[metrics] topic_series``): per-topic series for at
    most this many topic-partitions, the worst first (``metrics.selection``)."""
    from streamoffload.streaming.job.queries import QUERY_NAME
    from streamoffload.streaming.job.runs import METADATA_RELIST_S

    if backlog is None:
        backlog_path = _source_option(job, "backlogFile")
        backlog = backlog_file_provider(backlog_path) if backlog_path else None
    if topic_series is None:
        topic_series = job.config.metrics.topic_series
    # The job tells what its batches (and each run's recovery) wrote: the store refresh lists only that, and
    # every other topic-partition once per METADATA_RELIST_S.
    listeners = job.metadata_listeners
    metrics = JobMetrics(
        job.metadata(),
        backlog=backlog,
        store_refresh_s=store_refresh_s,
        backlog_interval_s=backlog_interval_s,
        topic_series=topic_series,
        relist_s=METADATA_RELIST_S if listeners is not None else None,
    )
    if listeners is not None:
        listeners.append(metrics.mark_changed)
        metrics.on_stop(lambda: _remove(listeners, metrics.mark_changed))
    metrics.start_refresher()
    health = job.health
    if health is not None:
        metrics.job_health = lambda: health.current
    if hasattr(job, "policy_effective_ms"):  # an OffloadJob: when its newest policy version takes effect
        metrics.policy_effective_ms = lambda: int(getattr(job, "policy_effective_ms", 0))
    tables = getattr(job, "table_figures", None)  # the offload job's (JobRuns.table_figures); not every job has tables
    if callable(tables):
        metrics.table_figures = tables
    job.listeners.append(metrics.on_batch)
    metrics.on_stop(lambda: _remove(job.listeners, metrics.on_batch))
    if spark is not None:
        listener = progress_listener(QUERY_NAME, metrics.on_progress, metrics.on_query_failed)
        spark.streams.addListener(listener)
        metrics.on_stop(lambda: spark.streams.removeListener(listener))
    try:
        metrics.start_server(address)
    except Exception:
        metrics.stop()
        raise
    return metrics


def _source_option(job: MetricsJob, name: str) -> str | None:
    try:
        return job.source_options().get(name)
    except Exception:  # no topics configured, or a job without source options (tests)
        return None


def _remove(items: list[Any], item: Any) -> None:
    with contextlib.suppress(ValueError):
        items.remove(item)
