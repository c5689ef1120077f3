"""Prometheus metrics of the offload job, served by the driver over HTTP (loopback by default).

Design: the values are TRUE, also across restarts
-------------------------------------------------
What has been offloaded is a fact of the store, not of this process, so the offload totals are
derived from the store's metadata and kept per segment UUID:

* At start, :meth:`JobMetrics.refresh_store` reads every segment manifest (``checkpoints``), so
  ``streamoffload_entries_offloaded_total`` equals what the store holds right away, and a restarted
  job continues its counters where the store says they are instead of from zero.
* Every micro-batch's :class:`~streamoffload.streaming.job.report.BatchReport` adds the segments it sealed
  at once (no wait for the next refresh). A segment is counted once, by UUID, whichever of the two
  sees it first, so a replayed micro-batch or a refresh racing a batch never counts twice.
* The store is re-read every ``store_refresh_s`` (and the topic of every seal right after it, for
  the publish time the lag needs) through a ``checkpoints.metadata_view.MetadataView``: a refresh
  costs one listing of each topic-partition's ``_meta/`` plus reads of what changed since (Offloaded
  manifests never change and are cached by key); the whole store is listed only to discover
  topic-partitions, at the first refresh and every ``topic_rediscovery_s`` (the job's batches name
  new ones in between).
* Counters never go down while the process runs: a segment deleted by retention stays counted.
  After a restart they continue from what the store holds, deleted segments included: a deleted
  segment's record keeps its entry, byte and size figures, and compaction folds old records into
  a per-topic summary that keeps them too. Of the two views (what this process counted, segment by
  segment, and what the store says), the one that knows more segments is exported.

Lag: ``streamoffload_offload_lag_seconds`` is 0 when the newest offloaded position is at or past
the latest position of the topic-partition (nothing published waits), and otherwise now minus the
publish time of the newest offloaded entry: an upper bound of the age of the oldest entry not yet
offloaded (readable), exact when traffic is continuous. The latest position comes from Spark's
progress of every micro-batch (the Pulsar source reports its latest offset, ``reportLatestOffset``,
and the offset it consumed), from an optional :data:`BacklogProvider` (the source's
``backlogFile``, or :func:`pulsar_backlog` asking the broker), and from the last position the job
itself has read, whichever is newest; so after new traffic the lag can read 0 until the next
micro-batch looks at the source (one trigger interval).

Entries behind (``streamoffload_backlog_entries``) = entries between the source's consumed and latest
positions + entries read but still in the open segment; exported only when exact (both positions
in one ledger: the sizes of earlier ledgers are not known without Pulsar's admin API).

Process-lifetime distributions (upload latency, micro-batch duration) are ordinary prometheus-client
histograms: they describe this process's work and reset with it, as Prometheus expects.

Bounded: per-topic series exist for at most ``[metrics] topic_series`` topic-partitions per scrape, the
worst first (set aside, failing, then by lag and backlog); the ``streamoffload_namespace_*`` families sum
over every topic-partition (``selection``).

The package: ``definitions`` (what is exported), ``model`` (per topic-partition state and
totals), ``collector`` (``JobMetrics``: recording and exposition), ``selection`` (which topic-partitions
get per-topic series; namespace totals), ``sources`` (where latest positions and cache counters come
from), ``serving`` (the HTTP endpoint) and ``install`` (wiring to a job).

Everything lives in a dedicated ``CollectorRegistry`` so tests and several jobs in one process
never collide with prometheus-client's global registry.
"""
