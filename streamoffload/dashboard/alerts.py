"""Prometheus alerting rules of the offload job, over the metric definitions of
``streamoffload.metrics.definitions``."""

from __future__ import annotations

from typing import Any

from streamoffload.dashboard.model import STALE_BATCH_CRIT_S
from streamoffload.metrics import definitions as m

ALERT_GROUP = "streamoffload"
RUNBOOK_URL = "docs/RUNBOOK.md"
"""Where each rule's ``runbook_url`` points by default: the runbook in this repository, one section per alert
(``#`` and the alert's name in lower case). ``dashboard export --alerts --runbook-url URL`` points them at the
copy the operators read (a git host's page of the file)."""


def runbook_anchor(alert: str) -> str:
    """The anchor of an alert's section of docs/RUNBOOK.md (its heading is the alert's name)."""
    return alert.lower()


def alert_rules(
    *,
    rollover_minutes: float = 10.0,
    lag_rollovers: float = 3.0,
    stale_batch_s: float = STALE_BATCH_CRIT_S,
    job: str = "streamoffload",
    throttled_share: float = 0.1,
    restart_loop_restarts: int = 3,
    runbook_url: str = RUNBOOK_URL,
) -> dict[str, Any]:
    """Prometheus alerting rules (a rule file's document) for the offload job scraped under ``job``:

    * ``StreamoffloadLagHigh``: the lag (``streamoffload_offload_lag_seconds``, the definition ``status`` shows)
      of a topic-partition is above ``lag_rollovers`` rollover times: segments are not sealed when they should
      be. Per-topic series exist only for the worst topic-partitions (``[metrics] topic_series``), and a
      lagging one ranks high by lag, so it has them unless more than that many are worse. Not while the job is
      held back by its rate limits (``throttled``: its tasks waited for them more than ``throttled_share`` of
      the time over 10 minutes): then ``StreamoffloadLagHighRateLimited`` fires instead (severity info: the
      configured limit at work, raise it or accept the lag); the namespace alert likewise;
    * ``StreamoffloadNamespaceLagHigh``: the same on the largest lag of a namespace
      (``streamoffload_namespace_max_offload_lag_seconds``), which covers every topic-partition, so it fires
      even when more topic-partitions lag than have per-topic series;
    * ``StreamoffloadUploadsFailing``: sink actions keep failing (the query restarts and retries them);
    * ``StreamoffloadFailedSegments``: a segment stays Failed;
    * ``StreamoffloadBatchesStale``: no micro-batch finished for ``stale_batch_s`` seconds (a stuck job);
    * ``StreamoffloadStoreMetadataUnreadable``: the job cannot read the store's metadata;
    * ``StreamoffloadBrokerUnreachable``: the job's Pulsar broker does not answer (the job keeps retrying);
    * ``StreamoffloadRestartLoop``: the job restarted its run ``restart_loop_restarts`` times or more in 15
      minutes (each a failure of its query or of a run's start);
    * ``StreamoffloadJobDown``: the job is not scraped (stopped, crashed, or fenced: a fenced instance stops).

    Every rule has a ``runbook_url`` annotation: ``runbook_url`` and the anchor of the alert's section
    (:func:`runbook_anchor`), which says what it means, how to check and what to do.
    """
    lag_s = rollover_minutes * 60 * lag_rollovers
    selector = f'{{job="{job}"}}'
    throttled = f"(sum by (job, instance) (rate({m.THROTTLED_SECONDS.total}{selector}[10m])) > {throttled_share:g})"
    topic_lag = f"max by (job, instance, topic) ({m.OFFLOAD_LAG.name}{selector}) > {lag_s:g}"
    namespace_lag = f"max by (job, instance, namespace) ({m.NAMESPACE_MAX_OFFLOAD_LAG.name}{selector}) > {lag_s:g}"
    rules: list[dict[str, Any]] = [
        {
            "alert": "StreamoffloadLagHigh",
            "expr": f"({topic_lag}) unless on (job, instance) {throttled}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "offload lag of {{ $labels.topic }} is {{ $value | humanizeDuration }}",
                "description": f"The newest offloaded entry of {{{{ $labels.topic }}}} is older than {lag_rollovers:g} "
                f"rollover times ({lag_s:g} s) while newer entries wait. Check the job's log and "
                "`streamoffload status`.",
            },
        },
        {
            "alert": "StreamoffloadLagHighRateLimited",
            "expr": f"({topic_lag}) and on (job, instance) {throttled}",
            "for": "5m",
            "labels": {"severity": "info", "throttled": "true"},
            "annotations": {
                "summary": "offload lag of {{ $labels.topic }} is {{ $value | humanizeDuration }} under rate limits",
                "description": f"The newest offloaded entry of {{{{ $labels.topic }}}} is older than {lag_rollovers:g} "
                f"rollover times ({lag_s:g} s) while the job's tasks spend more than {throttled_share:.0%} of their "
                "time waiting for the offload policy's rate limits (streamoffload_throttled_seconds_total): the lag "
                "is the configured limit at work. Raise offload*RateBytesPerSecond if it is too low.",
            },
        },
        {
            "alert": "StreamoffloadNamespaceLagHigh",
            "expr": f"({namespace_lag}) unless on (job, instance) {throttled}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "offload lag in namespace {{ $labels.namespace }} is {{ $value | humanizeDuration }}",
                "description": f"A topic-partition of {{{{ $labels.namespace }}}} has its newest offloaded entry older "
                f"than {lag_rollovers:g} rollover times ({lag_s:g} s) while newer entries wait. "
                "`streamoffload_namespace_topic_partitions_failing` and the per-topic series (the worst "
                "topic-partitions) say which; so does `streamoffload status`.",
            },
        },
        {
            "alert": "StreamoffloadUploadsFailing",
            "expr": f"sum by (job, instance) (increase({m.UPLOAD_ERRORS.total}{selector}[10m])) > 0",
            "for": "10m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "uploads to the object store keep failing on {{ $labels.instance }}",
                "description": "Part uploads or seals failed in each of the last 10 minutes; the query restarts "
                "and retries them. Check the store's credentials, quota and reachability.",
            },
        },
        {
            "alert": "StreamoffloadFailedSegments",
            "expr": f'sum by (job, instance, topic) ({m.SEGMENTS.name}{{job="{job}",status="Failed"}}) > 0',
            "for": "15m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.topic }} has a Failed segment",
                "description": "A segment stays Failed: it is retried before any new segment opens, so the topic "
                "does not progress. See `streamoffload status`.",
            },
        },
        {
            "alert": "StreamoffloadTopicSetAside",
            "expr": f"max by (job, instance, topic) ({m.TOPIC_SET_ASIDE.name}{selector}) > 0",
            "for": "1m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.topic }} keeps failing and is set aside",
                "description": "Its offload failed again and again, so the job pauses it (retrying after a "
                "backoff) while the other topics go on. `streamoffload status` shows why.",
            },
        },
        {
            "alert": "StreamoffloadBatchesStale",
            "expr": f"time() - max by (job, instance) ({m.LAST_BATCH_TIME.name}{selector}) > {stale_batch_s:g}",
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "no micro-batch finished on {{ $labels.instance }} for {{ $value | humanizeDuration }}",
                "description": "The job runs but its query makes no progress (stuck Spark, an unreachable broker).",
            },
        },
        {
            "alert": "StreamoffloadStoreMetadataUnreadable",
            "expr": f"min by (job, instance) ({m.METADATA_REFRESH_OK.name}{selector}) == 0",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.instance }} cannot read the store's metadata",
                "description": "The metrics' store refresh fails: offload totals and the lag may be stale.",
            },
        },
        {
            "alert": "StreamoffloadBrokerUnreachable",
            "expr": f"max by (job, instance) ({m.BROKER_UNREACHABLE.name}{selector}) == 1",
            "for": "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "the Pulsar broker of {{ $labels.instance }} is unreachable",
                "description": "The job cannot reach its broker's service URL and retries with capped backoff; "
                "nothing is read meanwhile, and the topics' backlog grows on the broker. `streamoffload "
                "status` names the URL and the cause.",
            },
        },
        {
            "alert": "StreamoffloadRestartLoop",
            "expr": f"sum by (job, instance) (increase({m.QUERY_RESTARTS.total}{selector}[15m])) "
            f">= {restart_loop_restarts:d}",
            "for": "1m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.instance }} restarted its run {{ $value | humanize }} times in 15 minutes",
                "description": "The job's query (or a run's start) keeps failing and the job keeps starting it "
                "again from the store: something fails every run. The job's log says what.",
            },
        },
        {
            "alert": "StreamoffloadJobDown",
            "expr": f'up{selector} == 0 or absent(up{{job="{job}"}})',
            "for": "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "the offload job {{ $labels.instance }} is down",
                "description": "Prometheus cannot scrape the job: it stopped, crashed or was fenced by another "
                "instance (a fenced job exits). Nothing is offloaded meanwhile.",
            },
        },
    ]
    for rule in rules:
        rule["annotations"]["runbook_url"] = f"{runbook_url}#{runbook_anchor(rule['alert'])}"
    return {"groups": [{"name": ALERT_GROUP, "rules": rules}]}
