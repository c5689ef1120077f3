"""``streamoffload offload-status``: what became of ``offload-now`` requests (like ``pulsar-admin topics
offload-status [-w]``).

``--json`` also speaks Pulsar's ``OffloadProcessStatus`` (what ``GET /admin/v2/persistent/{topic}/offload``
returns) for each topic-partition: ``status`` NOT_RUN | RUNNING | SUCCESS | ERROR, ``lastError`` ("" unless
ERROR) and ``firstUnoffloadedMessage``, a MessageId with Pulsar's fields. On SUCCESS it is the position right
after the last entry the request's segment holds (everything before it is in the store); otherwise Pulsar's
``earliest`` (-1:-1), as the broker says. Its ``partitionIndex`` is -1, as the broker's is for a partition.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import DONE, FAILED, PENDING, RUNNING, RequestState, list_requests
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, CommandError, add_store_args, config_from_args
from streamoffload.codecs.topics import TopicName
from streamoffload.commands.offload_now import partitions_of
from streamoffload.errors import ConfigError
from streamoffload.printable import printable
from streamoffload.storage.location import ScopedStore

NONE = "none"

PULSAR_STATUS = {NONE: "NOT_RUN", PENDING: "RUNNING", RUNNING: "RUNNING", DONE: "SUCCESS", FAILED: "ERROR"}
"""Pulsar's ``LongRunningProcessStatus.Status`` for each state: Pulsar starts an offload when asked, so a request
still waiting for the job is RUNNING there too."""


@dataclass(frozen=True)
class MessageId:
    """Pulsar's ``MessageIdImpl`` as its admin REST API writes it in JSON."""

    ledger_id: int
    entry_id: int
    partition_index: int = -1

    def as_dict(self) -> dict[str, int]:
        return {
            "ledgerId": self.ledger_id,
            "entryId": self.entry_id,
            "partitionIndex": self.partition_index,
            "batchIndex": -1,
            "batchSize": 0,
        }


EARLIEST = MessageId(-1, -1)
"""Pulsar's ``MessageId.earliest``: what ``firstUnoffloadedMessage`` says unless an offload succeeded."""


class NoOffloadRequestsError(CommandError):
    """The topic has no offload requests at all in the store."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "offload-status",
        help="state of the offload-now requests of a topic",
        description="Show, per topic-partition of TOPIC, the state of its latest offload-now request: "
        "'Offload has not been run', 'Offload in progress' (pending or running), 'Offload was a success "
        "(segment UUID)' or 'Error in offload: WHY'. Finished requests are remembered for a day.\n\n"
        "exit status with --wait: 0 when every request finished and the latest of each partition "
        "succeeded, 1 when one failed, 3 on --timeout; 1 with an error when TOPIC has no requests at all.",
        epilog="example:\n  streamoffload offload-now --store file:///data/offload orders\n"
        "  streamoffload offload-status --store file:///data/offload orders --wait --timeout 300",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic", metavar="TOPIC", help="topic or topic-partition")
    parser.add_argument(
        "-w", "--wait", action="store_true", help="wait until no request of TOPIC is pending or running"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --wait, give up after SECONDS (exit status 3); default: wait for as long as it takes",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON document instead of text; each topic-partition's also carries Pulsar's OffloadProcessStatus "
        "fields (what `pulsar-admin topics offload-status` reads): status NOT_RUN|RUNNING|SUCCESS|ERROR, lastError "
        "and firstUnoffloadedMessage (the position after the last entry offloaded; -1:-1 unless SUCCESS)",
    )
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class PartitionStatus:
    """The requests of one topic-partition and the one its state is reported from."""

    topic: str
    requests: list[RequestState] = field(default_factory=list)

    @property
    def in_progress(self) -> list[RequestState]:
        return [r for r in self.requests if r.state in (PENDING, RUNNING)]

    @property
    def latest(self) -> RequestState | None:
        """The newest unfinished request, else the one that finished last."""
        if self.in_progress:
            return max(self.in_progress, key=lambda r: r.id)
        finished = [r for r in self.requests if r.finished]
        return max(finished, key=lambda r: (r.at_ms or 0, r.id)) if finished else None

    @property
    def state(self) -> str:
        """none | pending | running | done | failed"""
        if any(r.state == RUNNING for r in self.in_progress):
            return RUNNING
        latest = self.latest
        return latest.state if latest is not None else NONE

    @property
    def message(self) -> str:
        latest, state = self.latest, self.state
        if latest is None:
            return "Offload has not been run"
        if state == PENDING:
            return "Offload in progress (waiting for the job to pick the request up)"
        if state == RUNNING:
            return "Offload in progress"
        if state == DONE:
            what = f"segment {latest.segment}" if latest.segment else "no open segment to seal"
            return f"Offload was a success ({what})"
        if state == FAILED:
            return f"Error in offload: {latest.error or 'no reason recorded'}"
        return f"Offload request {latest.id} in unknown state {state!r}"

    def as_dict(self, first_unoffloaded: MessageId = EARLIEST) -> dict[str, Any]:
        """Ours, then Pulsar's ``OffloadProcessStatus`` fields (module docstring); ``first_unoffloaded`` from
        :func:`first_unoffloaded`."""
        latest, state = self.latest, self.state
        return {
            "topic": self.topic,
            "state": state,
            "message": self.message,
            "request": latest.id if latest else None,
            "segment": latest.segment if latest else None,
            "error": latest.error if latest else None,
            "requests": [r.as_dict() for r in self.requests],
            "status": PULSAR_STATUS.get(state, "ERROR"),
            "lastError": (latest.error or "no reason recorded") if latest is not None and state == FAILED else "",
            "firstUnoffloadedMessage": (first_unoffloaded if state == DONE else EARLIEST).as_dict(),
        }


def first_unoffloaded(meta: MetadataStore, partition: PartitionStatus) -> MessageId:
    """Where the store's copy of the topic-partition ended when its latest request succeeded: the position after
    the last entry of the segment it sealed, or, when nothing was open to seal, of the last segment offloaded by
    then. Pulsar's ``earliest`` unless the latest request succeeded (or when no segment is offloaded)."""
    latest = partition.latest
    if latest is None or partition.state != DONE:
        return EARLIEST
    segments = meta.offloaded_segments(partition.topic)
    sealed = [s for s in segments if str(mf.manifest_uuid(s)) == latest.segment] if latest.segment else []
    if not sealed:
        sealed = [s for s in segments if latest.at_ms is not None and s.offloadedTimestamp <= latest.at_ms]
    if not sealed:
        return EARLIEST
    ledger_id, entry_id = mf.end_position(sealed[-1])
    return MessageId(ledger_id, entry_id + 1)


def topic_status(scoped: ScopedStore, topic: str) -> list[PartitionStatus]:
    """Per topic-partition of ``topic`` (known to the metadata, or named by a request), its requests."""
    name = TopicName.parse(topic)
    requests = list_requests(scoped, topic)
    by_topic: dict[str, list[RequestState]] = {}
    for request in requests:
        by_topic.setdefault(str(TopicName.parse(request.topic)), []).append(request)
    known = MetadataStore(scoped).topics()
    names = {str(t) for t in known if t == name or (not name.is_partition and t.base == name)} | set(by_topic)
    return [PartitionStatus(n, by_topic.get(n, [])) for n in sorted(names or {str(name)})]


def render(partitions: list[PartitionStatus]) -> str:
    return "\n".join(printable(f"{p.topic}: {p.message}") for p in partitions)  # requests are read from the store


def wait_for(
    fetch: Callable[[], list[PartitionStatus]],
    *,
    timeout: float | None,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[PartitionStatus], bool]:
    """Poll until no request is pending or running; returns the last statuses and whether it timed out."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        partitions = fetch()
        if not any(p.in_progress for p in partitions):
            return partitions, False
        if deadline is not None and clock() >= deadline:
            return partitions, True
        pause = interval if deadline is None else max(0.0, min(interval, deadline - clock()))
        sleep(pause)


def run(args: argparse.Namespace, *, out: TextIO | None = None, interval: float = 1.0) -> int:
    out = out or sys.stdout
    if args.timeout is not None and not args.wait:
        raise ConfigError("--timeout applies only with --wait")
    if args.timeout is not None and args.timeout < 0:
        raise ConfigError(f"--timeout {args.timeout}: must be zero or more seconds")
    config, _ = config_from_args(args)
    scoped = config.store.location.open(create=False)  # a mistyped path is an error, not a new empty store

    def fetch() -> list[PartitionStatus]:
        return topic_status(scoped, args.topic)

    partitions = fetch()
    if not any(p.requests for p in partitions):
        # A mistyped name has no requests either: say so, as offload-now does, rather than "none submitted".
        partitions_of(MetadataStore(scoped), args.topic, config.pulsar.topics)
        raise NoOffloadRequestsError(
            f"no offload requests for {args.topic} in {scoped.store.url} (none submitted with offload-now, "
            "or all finished more than a day ago)"
        )
    timed_out = False
    if args.wait:
        partitions, timed_out = wait_for(fetch, timeout=args.timeout, interval=interval)
    failed = any(p.state == FAILED for p in partitions)
    if args.json:
        meta = MetadataStore(scoped)
        docs = [p.as_dict(first_unoffloaded(meta, p)) for p in partitions]
        doc = {"topic": args.topic, "timed_out": timed_out, "partitions": docs}
        print(json.dumps(doc, indent=2), file=out)
    else:
        print(render(partitions), file=out)
    if timed_out:
        left = sum(len(p.in_progress) for p in partitions)
        print(
            f"streamoffload offload-status: timed out after {args.timeout:g}s with {left} request(s) of "
            f"{args.topic} still pending or running",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    if args.wait and failed:
        return EXIT_FAILED
    return EXIT_OK
