"""``streamoffload dashboard export|push``: the Grafana dashboard as code."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from streamoffload.dashboard.alerts import RUNBOOK_URL, alert_rules
from streamoffload.dashboard.export import alert_rules_yaml, dashboard_json
from streamoffload.dashboard.grafana import DATASOURCE_NAME, connect, push_dashboard

EPILOG = """\
examples:
  streamoffload dashboard export -o docker/grafana/dashboards/streamoffload.json
  streamoffload dashboard export --alerts -o docker/prometheus-alerts.yml   # then: promtool check rules FILE
  streamoffload dashboard export --alerts --rollover-minutes 5 --prometheus-job offload
  streamoffload dashboard push --grafana-url http://127.0.0.1:3000 --token "$GRAFANA_TOKEN" \\
      --datasource-url http://prometheus:9090
  GRAFANA_PASSWORD=admin streamoffload dashboard push --grafana-url http://127.0.0.1:3000 --user admin

The job serves its metrics on [metrics] address (default 127.0.0.1:9464); point Prometheus at it.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="export the Grafana dashboard, or push it to Grafana",
        description="The Grafana dashboard of the offload job (lag, throughput, segments, errors, buffer, "
        "micro-batches; a topic variable; the Prometheus data source as a variable).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="dashboard_action", metavar="ACTION", required=True)

    export = actions.add_parser(
        "export",
        help="write the dashboard JSON, or the Prometheus alert rules",
        description="Write the dashboard JSON (for Grafana's file provisioning or the import dialog), or with "
        "--alerts the Prometheus alerting rules (lag over N rollover times, failing uploads, Failed segments, "
        "stale micro-batches, unreadable store metadata, an unreachable broker, a restart loop, a stopped or "
        "fenced job), each with a runbook_url into docs/RUNBOOK.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    export.add_argument("--alerts", action="store_true", help="write the Prometheus alert rule file (YAML) instead")
    export.add_argument(
        "--rollover-minutes",
        type=float,
        default=10.0,
        help="--alerts: the job's maxOffloadSegmentRolloverTimeMinutes (default: %(default)s)",
    )
    export.add_argument(
        "--lag-rollovers",
        type=float,
        default=3.0,
        help="--alerts: alert when the lag exceeds this many rollover times (default: %(default)s)",
    )
    export.add_argument(
        "--prometheus-job",
        default="streamoffload",
        help="--alerts: the Prometheus job name the offload job is scraped under (default: %(default)s)",
    )
    export.add_argument(
        "--runbook-url",
        default=RUNBOOK_URL,
        metavar="URL",
        help="--alerts: where each rule's runbook_url points, docs/RUNBOOK.md as your operators reach it "
        "(default: %(default)s)",
    )
    export.set_defaults(func=run_export)

    push = actions.add_parser(
        "push",
        help="create or update the dashboard through Grafana's HTTP API",
        description="Create or overwrite the dashboard (uid 'streamoffload') through Grafana's HTTP API, and "
        "with --datasource-url create or update a Prometheus data source for it. Safe to repeat.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    push.add_argument("--grafana-url", required=True, metavar="URL", help="Grafana's base URL, e.g. http://host:3000")
    push.add_argument(
        "--token",
        default=os.environ.get("GRAFANA_TOKEN"),
        help="service account token (default: $GRAFANA_TOKEN)",
    )
    push.add_argument("--user", help="basic-auth user (instead of a token)")
    push.add_argument(
        "--password",
        default=os.environ.get("GRAFANA_PASSWORD"),
        help="basic-auth password (default: $GRAFANA_PASSWORD)",
    )
    push.add_argument(
        "--datasource-url",
        metavar="PROM_URL",
        help="also create/update a Prometheus data source with this URL (as Grafana's server reaches it)",
    )
    push.add_argument(
        "--datasource-name", default=DATASOURCE_NAME, help="name of that data source (default: %(default)s)"
    )
    push.add_argument("--folder-uid", help="Grafana folder to put the dashboard in (default: General)")
    push.set_defaults(func=run_push)


def run_export(args: argparse.Namespace) -> int:
    from streamoffload.cli_common import float_arg

    if args.alerts:
        float_arg(args.rollover_minutes, "--rollover-minutes", 1e-3, 43200.0)
        float_arg(args.lag_rollovers, "--lag-rollovers", 1e-3, 1e6)
        rules = alert_rules(
            rollover_minutes=args.rollover_minutes,
            lag_rollovers=args.lag_rollovers,
            job=args.prometheus_job,
            runbook_url=args.runbook_url,
        )
        text = alert_rules_yaml(rules)
    else:
        text = dashboard_json()
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def run_push(args: argparse.Namespace) -> int:
    # An explicit --user means basic auth even when GRAFANA_TOKEN is set in the environment.
    token = None if args.user else args.token
    api = connect(args.grafana_url, token=token, user=args.user, password=args.password)
    result = push_dashboard(
        api,
        args.grafana_url,
        prometheus_url=args.datasource_url,
        datasource_name=args.datasource_name,
        folder_uid=args.folder_uid,
    )
    if result.datasource_uid:
        verb = "created" if result.datasource_created else "updated"
        print(f"{verb} data source {args.datasource_name!r} (uid {result.datasource_uid}) -> {args.datasource_url}")
    version = f" (version {result.dashboard_version})" if result.dashboard_version is not None else ""
    print(f"dashboard saved{version}: {result.dashboard_url}")
    return 0
