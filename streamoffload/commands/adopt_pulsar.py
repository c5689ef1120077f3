"""``streamoffload adopt-pulsar``: Pulsar's own offloaded ledgers of a topic-partition into the store.

The command layer: which ledgers (the broker's admin API, or a saved ``info-internal``), which stores, the
summary. The checks, copies and commits are ``checkpoints.pulsar_adopt``.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from streamoffload.checkpoints.pulsar_adopt import (
    AdoptReport,
    PulsarLedger,
    adopt_ledgers,
    parse_internal_info,
)
from streamoffload.cli_common import CommandError, add_store_args, config_from_args, topic_arg
from streamoffload.codecs.topics import TopicName
from streamoffload.storage.location import parse_store_url

EPILOG = """\
examples:
  streamoffload adopt-pulsar --store s3://offload/streamoffload --s3-endpoint http://127.0.0.1:9000 \\
      --pulsar-store s3://pulsar-offload --admin-url http://127.0.0.1:8080 persistent://public/default/t-partition-0
  pulsar-admin topics info-internal persistent://public/default/t > t.json
  streamoffload adopt-pulsar --conf conf/streamoffload.toml --pulsar-store s3://pulsar-offload \\
      --internal-info t.json persistent://public/default/t

Pulsar's jcloud offloader (managedLedgerOffloadDriver aws-s3 or S3) keeps each offloaded ledger at its bucket's
root as <uuid>-ledger-<id> and <uuid>-ledger-<id>-index; only the broker knows which UUID is the ledger's
(`pulsar-admin topics info-internal`, offloadedContextUuid). Each ledger is checked (format version 1, the
topic's managed-ledger name on both objects, a v1 index of the ledger, the broker's last entry and length),
copied byte for byte into the topic's directory of --store, and committed as a v1 segment in the next place of
the topic's history: `read`, `verify`, `status`, the pulsar-offloaded reader and read-through then read it as
they read the job's segments, and Pulsar's later deletion of its own objects does not touch the copies.

Ledgers go in order and stop at the first one Pulsar has not offloaded; one at or before the store's last
offloaded position is skipped, one adopted before is reported so (a rerun is a no-op). --pulsar-store is read
with the same --s3-endpoint and --s3-region as --store. To read Pulsar's objects in place without adopting
them: streamoffload read --store s3://pulsar-offload --data-key <uuid>-ledger-<id> (and verify --data-key)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "adopt-pulsar",
        help="copy Pulsar's own offloaded ledgers of a topic-partition into the store, as v1 segments",
        description=(
            "Adopt the ledgers Apache Pulsar's own offloader (tiered storage, jcloud aws-s3) offloaded for a "
            "topic-partition: check them against the broker's metadata, copy them into the store and commit them "
            "as v1 (ledger-based) segments, so every reader of the store reads them."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument(
        "topic", metavar="TOPIC", help="topic-partition, e.g. persistent://public/default/t-partition-0"
    )
    parser.add_argument(
        "--pulsar-store",
        metavar="URL",
        required=True,
        help="where Pulsar's offloader wrote: s3://BUCKET (its s3ManagedLedgerOffloadBucket; objects at the root)",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--admin-url", metavar="URL", help="the broker's admin API (webServiceUrl), e.g. http://127.0.0.1:8080"
    )
    which.add_argument(
        "--internal-info",
        metavar="FILE",
        help="the JSON of `pulsar-admin topics info-internal TOPIC` (for a broker this command cannot reach)",
    )
    parser.add_argument("--dry-run", action="store_true", help="check the ledgers; copy and commit nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a line per ledger")
    parser.set_defaults(func=run)


class AdoptCommandError(CommandError):
    """What adopt-pulsar was given does not lead to Pulsar's ledgers."""


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    topic = topic_arg(args.topic, config)
    ledgers = _ledgers(args, topic)
    source = parse_store_url(args.pulsar_store, endpoint=args.s3_endpoint, region=args.s3_region).open(create=False)
    into = config.store.location.open(create=False)
    try:
        report = adopt_ledgers(source, into, topic, ledgers, dry_run=args.dry_run)
    finally:
        source.store.close()
        into.store.close()
    _print(report, as_json=args.json)
    return 0


def _ledgers(args: argparse.Namespace, topic: TopicName) -> list[PulsarLedger]:
    if args.internal_info:
        saved = Path(args.internal_info)
        try:
            doc = json.loads(saved.read_text(encoding="utf-8"))
        except OSError as err:
            raise AdoptCommandError(f"--internal-info {saved}: cannot read it: {err.strerror or err}") from None
        except ValueError as err:
            raise AdoptCommandError(f"--internal-info {saved}: not JSON: {err}") from None
        return parse_internal_info(doc, str(saved))
    base = args.admin_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise AdoptCommandError(f"--admin-url {args.admin_url!r}: expected an http:// or https:// URL")
    path = "/".join(urllib.parse.quote(part, safe="") for part in (topic.tenant, topic.namespace, topic.local_name))
    url = f"{base}/admin/v2/{topic.domain}/{path}/internal-info"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            doc = json.loads(response.read())
    except urllib.error.HTTPError as err:
        reason = err.read().decode("utf-8", "replace")[:300]
        raise AdoptCommandError(f"GET {url}: HTTP {err.code} {reason}") from None
    except (OSError, ValueError) as err:
        raise AdoptCommandError(f"GET {url}: {err}") from None
    return parse_internal_info(doc, url)


def _print(report: AdoptReport, *, as_json: bool) -> None:
    if as_json:
        doc: dict[str, Any] = {
            "topic": report.topic,
            "ledgers": [
                {
                    "ledger_id": ledger.ledger_id,
                    "outcome": ledger.outcome,
                    "reason": ledger.reason or None,
                    "uuid": str(ledger.offload_uuid) if ledger.offload_uuid else None,
                    "entries": ledger.entries,
                    "data_bytes": ledger.data_bytes,
                    "data_key": ledger.data_key or None,
                }
                for ledger in report.ledgers
            ],
        }
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return
    for ledger in report.ledgers:
        detail = ledger.reason or f"{ledger.entries} entries, {ledger.data_bytes} bytes: {ledger.data_key}"
        print(f"{report.topic} ledger {ledger.ledger_id}: {ledger.outcome} ({detail})")
    done = report.count("adopted") + report.count("to adopt")
    print(f"{report.topic}: {done} ledgers {'to adopt' if report.count('to adopt') else 'adopted'}")
