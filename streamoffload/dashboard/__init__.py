"""The Grafana dashboard and the Prometheus alert rules of the offload job, as code.

* ``model``: :func:`~streamoffload.dashboard.model.build_dashboard`, the dashboard built with
  grafana-foundation-sdk's builders (the ``dashboard`` extra, its build for Grafana 11.1) from panel
  specifications over the families of ``streamoffload.metrics.definitions`` (each query names its metric
  through its definition, so a renamed metric cannot leave a panel silently empty): lag and backlog,
  a per-topic table, throughput, segments, errors and uploads, health (broker, restarts, set-aside topics,
  the read cache), the offload buffer and Spark micro-batches, and a panel derived from its definition for
  every family none of those queries; each series in the unit of what it counts, thresholds on the lag, open
  segment age and staleness; annotations for query restarts and policy changes; a ``datasource`` variable
  (any Prometheus data source) and ``job``, ``instance``, ``namespace`` and ``topic`` variables
  (multi-select, "All" = ``.*``; the namespace is the tenant/namespace part of the ``topic`` label).
* ``alerts``: the matching Prometheus rule document, each rule with a ``runbook_url`` into docs/RUNBOOK.md.
* ``export``: both as the text files ``dashboard export`` writes (JSON; YAML without a YAML library).
* ``grafana``: pushing the dashboard through Grafana's HTTP API. It creates or updates it
  (``POST /api/dashboards/db`` with ``overwrite``) and, if asked, a Prometheus data source
  (``POST /api/datasources``, or ``PUT /api/datasources/uid/<uid>`` when it exists), with the standard
  library's ``urllib``. Both are idempotent: pushing twice leaves one dashboard and one data source.
"""
