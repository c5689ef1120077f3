"""The options of the Pulsar source (``streaming/source/pulsar_source.py``, whose docstring lists them), parsed and
checked in plain Python: :class:`SourceOptions`, the ``startingOffsets``/``endingOffsets`` and
``topicsPattern`` syntaxes. Each error is one line naming the option."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamoffload.codecs.positions import Position
from streamoffload.config import parse_pattern
from streamoffload.errors import ConfigError
from streamoffload.pulsar.client_options import (
    ConnectionConfig,
    ServiceAddress,
    client_kwargs,
    client_options,
)
from streamoffload.pulsar.exactly_once import ReaderSettings
from streamoffload.storage.location import StoreLocation, parse_store_url
from streamoffload.streaming.control.rate_limits import RateLimitSpec
from streamoffload.streaming.source.option_values import (
    parse_bool,
    parse_positive,
    parse_seconds,
    parse_size,
    parse_topic,
)

READERS = ("raw", "client")
DEFAULT_MAX_PARTITIONS = 64
"""Input partitions per micro-batch at most, unless ``maxPartitions`` says otherwise: a Spark task costs more than
a small range (``input_ranges``), and 64 keep a cluster of dozens of cores busy. The offload job sets it from
Spark's parallelism."""


StartSpec = str | dict[str, Position | str]


@dataclass(frozen=True)
class SourceOptions:
    service_url: str
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    pattern_candidates: tuple[str, ...] = ()
    starting_offsets: StartSpec = "earliest"
    ending_offsets: StartSpec | None = None
    """Batch reads only: where each topic-partition's read ends (``None`` in a streaming query)."""
    fail_on_data_loss: bool = True
    max_entries_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    client_options: tuple[tuple[str, str], ...] = ()
    stall_timeout_ms: int = 200
    receiver_queue_size: int = 2000
    retry_timeout_s: float = 60.0
    discovery_interval_s: float = 10.0
    idle_poll_s: float = 0.0
    """A topic-partition with nothing new at its last lookup is asked for its latest position again only after
    about this long (0, the default: every trigger; the offload job sets 2 s)."""
    watched_poll_s: float = 30.0
    """With the raw reader: how often a quiet topic-partition whose held consumer watches it (the broker pushes
    its next entry) is asked about anyway, a bound on how late a lost push is made up for. 0: no consumer is
    held between triggers (each lookup subscribes and unsubscribes), so no watches."""
    arrow_batch_entries: int = 2000
    arrow_batch_bytes: int = 32 << 20
    min_partitions: int = 1
    """At least this many input partitions per micro-batch: one topic-partition's range is cut in pieces."""
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    """At most this many input partitions per micro-batch: more ranges are packed into groups a task reads."""
    backlog_file: str | None = None
    policy_versions_file: str | None = None
    buffer_file: str | None = None
    quarantine_file: str | None = None
    key_prefix: str | None = None
    """The store's key prefix: a topic found by ``topicsPattern`` whose keys the store cannot hold is skipped."""
    seal_at_end: bool = False
    """With ``Trigger.AvailableNow``: one last micro-batch of seal markers once everything was read."""
    reader: str = "raw"
    positions_only: bool = False
    """Rows carry each entry's position, size and CRC-32C but not its bytes (the offload job's control plane)."""
    spool_dir: str | None = None
    """With ``positions_only``: where the tasks keep the bytes they read for the sink (``streaming.handoff.spool``)."""
    spool_max_bytes: int = 2 << 30
    starting_time: int | None = None
    """``startingTime`` (ms since the epoch): each topic-partition starts at its first entry published then or
    later (``read/starting_time.py``); only when a query starts without a checkpoint."""
    offloaded: StoreLocation | None = None
    offloaded_keys_file: str | None = None
    """``offloaded.keysFile``: keys of stored segments encrypted at rest (``checkpoints.keyring``)."""
    """``offloaded.store``: read through the tier -- what the broker no longer holds comes from this store
    (``read/through.py``)."""
    rate_limits: RateLimitSpec | None = None
    """``rateLimits`` (the offload job's): where the tasks find the read limits (``streaming.control.rate_limits``)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate a source's options (any letter case); errors name the option."""
        opts = {k.lower(): v for k, v in options.items()}

        def get(name: str) -> str | None:
            value = opts.get(name.lower())
            return None if value is None or str(value).strip() == "" else str(value).strip()

        # streamnative/pulsar-spark's names are accepted too, so its users' options carry over:
        # service.url, topic (one topic) and admin.url (no admin API is needed: accepted, unused).
        service_url = get("serviceUrl") or get("service.url")
        if not service_url:
            raise ConfigError(
                "option serviceUrl is required (pulsar-spark's service.url too), e.g. pulsar://127.0.0.1:6650"
            )
        ServiceAddress.parse(service_url)
        single = get("topic")
        if single and get("topics"):
            raise ConfigError("give the option topic or topics, not both")
        topics_text, pattern = get("topics") or single, get("topicsPattern")
        if bool(topics_text) == bool(pattern):
            raise ConfigError("give exactly one of the options topics (a comma list) and topicsPattern (a regex)")
        topics = tuple(dict.fromkeys(parse_topic(t, "topics") for t in (topics_text or "").split(",") if t.strip()))
        if topics_text and not topics:
            raise ConfigError(f"option topics: no topic names in {topics_text!r}")
        if pattern:
            parse_pattern(pattern)
        candidate_text = get("topicsPatternCandidates") or ""
        candidates = tuple(parse_topic(t, "topicsPatternCandidates") for t in candidate_text.split(",") if t.strip())
        reader_settings = _reader_options(opts)
        client = tuple(sorted(client_options(options).items()))
        client_kwargs(dict(client))  # fail now, on the driver, not in a task
        reader = (get("reader") or "raw").lower()
        if reader not in READERS:
            raise ConfigError(f"option reader: expected raw or client, got {get('reader')!r}")
        if reader == "raw":
            ConnectionConfig.parse(service_url, dict(client))  # e.g. an auth plugin it does not speak
        return cls(
            service_url=service_url,
            topics=topics,
            topics_pattern=pattern,
            pattern_candidates=candidates,
            starting_offsets=parse_starting_offsets(get("startingOffsets") or "earliest"),
            ending_offsets=_opt(get("endingOffsets"), lambda t: parse_starting_offsets(t, "endingOffsets")),
            fail_on_data_loss=parse_bool(get("failOnDataLoss") or "true", "failOnDataLoss"),
            max_entries_per_trigger=_opt(
                get("maxEntriesPerTrigger"), lambda t: parse_positive(t, "maxEntriesPerTrigger")
            ),
            max_bytes_per_trigger=_opt(get("maxBytesPerTrigger"), lambda t: parse_size(t, "maxBytesPerTrigger")),
            client_options=client,
            stall_timeout_ms=_opt(get("stallTimeoutMs"), lambda t: parse_positive(t, "stallTimeoutMs")) or 200,
            receiver_queue_size=_opt(
                get("receiverQueueSize") or reader_settings.get("receiverqueuesize"),
                lambda t: parse_positive(t, "receiverQueueSize"),
            )
            or 2000,
            retry_timeout_s=_opt(get("retryTimeoutSeconds"), lambda t: parse_positive(t, "retryTimeoutSeconds", float))
            or 60.0,
            discovery_interval_s=float(get("discoveryIntervalSeconds") or 10.0),
            idle_poll_s=parse_seconds(get("idlePollSeconds") or "0", "idlePollSeconds"),
            watched_poll_s=parse_seconds(get("watchedPollSeconds") or "30", "watchedPollSeconds"),
            arrow_batch_entries=_opt(get("arrowBatchEntries"), lambda t: parse_positive(t, "arrowBatchEntries"))
            or 2000,
            arrow_batch_bytes=_opt(get("arrowBatchBytes"), lambda t: parse_size(t, "arrowBatchBytes")) or 32 << 20,
            min_partitions=_opt(get("minPartitions"), lambda t: parse_positive(t, "minPartitions")) or 1,
            max_partitions=_opt(get("maxPartitions"), lambda t: parse_positive(t, "maxPartitions"))
            or DEFAULT_MAX_PARTITIONS,
            backlog_file=get("backlogFile"),
            policy_versions_file=get("policyVersionsFile"),
            buffer_file=get("bufferFile"),
            quarantine_file=get("quarantineFile"),
            key_prefix=opts.get("keyprefix"),
            seal_at_end=parse_bool(get("sealAtEnd") or "false", "sealAtEnd"),
            reader=reader,
            positions_only=positions_only(options),
            spool_dir=get("spoolDir"),
            spool_max_bytes=_opt(get("spoolMaxBytes"), lambda t: parse_size(t, "spoolMaxBytes")) or 2 << 30,
            offloaded=_offloaded_store(get),
            offloaded_keys_file=get("offloaded.keysFile"),
            starting_time=_starting_time(get),
            rate_limits=_opt(get("rateLimits"), RateLimitSpec.from_option),
        )

    @property
    def client_opts(self) -> dict[str, str]:
        return dict(self.client_options)

    def reader_settings(self) -> ReaderSettings:
        return ReaderSettings(
            receiver_queue_size=self.receiver_queue_size,
            stall_timeout_ms=self.stall_timeout_ms,
            retry_timeout_s=self.retry_timeout_s,
            fail_on_data_loss=self.fail_on_data_loss,
        )


def _starting_time(get: Callable[[str], str | None]) -> int | None:
    text = get("startingTime")
    if text is None:
        return None
    if get("startingOffsets") is not None:
        raise ConfigError("give the option startingOffsets or startingTime, not both")
    from streamoffload.read.dataset_plan import parse_time

    return parse_time(text, "startingTime")


def _offloaded_store(get: Callable[[str], str | None]) -> StoreLocation | None:
    url = get("offloaded.store")
    endpoint, region = get("offloaded.s3.endpoint"), get("offloaded.s3.region")
    if url is None:
        if endpoint or region:
            raise ConfigError("options offloaded.s3.endpoint and offloaded.s3.region need offloaded.store")
        return None
    if positions_only({"positionsOnly": get("positionsOnly") or "false"}):
        raise ConfigError("option offloaded.store does not go with positionsOnly: the offload job reads the broker")
    try:
        return parse_store_url(url, endpoint=endpoint, region=region)
    except ConfigError as err:
        raise ConfigError(f"option offloaded.store: {err}") from None


def _opt(text: str | None, parse: Callable[[str], Any]) -> Any:
    return None if text is None else parse(text)


_READER_IGNORED = ("readername", "subscriptionroleprefix", "subscriptionname", "cryptofailureaction")


def _reader_options(opts: Mapping[str, str]) -> dict[str, str]:
    """pulsar-spark's ``pulsar.reader.*`` settings (lower-cased names without the prefix), checked."""
    prefix = "pulsar.reader."
    found = {k.removeprefix(prefix): str(v).strip() for k, v in opts.items() if k.startswith(prefix)}
    for name, value in found.items():
        if name == "readcompacted":
            if parse_bool(value, "pulsar.reader.readCompacted"):
                raise ConfigError(
                    "option pulsar.reader.readCompacted = true is refused: a compacted read skips entries, and an "
                    "offloader must carry the whole log"
                )
        elif name != "receiverqueuesize" and name not in _READER_IGNORED:
            raise ConfigError(
                f"option pulsar.reader.{name}: not supported; supported: receiverQueueSize, readCompacted (false), "
                "and (accepted, no effect) readerName, subscriptionRolePrefix, subscriptionName, cryptoFailureAction"
            )
    return found


def parse_starting_offsets(text: str, option: str = "startingOffsets") -> StartSpec:
    """``earliest``, ``latest`` or JSON of topic-partition -> ``[ledgerId, entryId]`` (or a word); errors name
    ``option`` (the batch sources parse their ``endingOffsets`` with it too, where ``earliest`` is refused)."""
    lowered = text.strip().lower()
    if option == "endingOffsets" and lowered == "earliest":
        raise ConfigError("option endingOffsets: expected latest or a JSON object of positions, got 'earliest'")
    if lowered in ("earliest", "latest"):
        return lowered
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"option {option}: expected earliest, latest or a JSON object of topic-partition -> "
            f"[ledgerId, entryId]; not valid JSON: {err}"
        ) from err
    if not isinstance(doc, dict):
        raise ConfigError(f"option {option}: the JSON must be an object of topic-partition -> [ledgerId, entryId]")
    spec: dict[str, Position | str] = {}
    for key, value in doc.items():
        if key == "*":
            if not (isinstance(value, str) and value.lower() in ("earliest", "latest")):
                raise ConfigError(f"option {option}: '*' must be 'earliest' or 'latest', got {value!r}")
            spec["*"] = value.lower()
            continue
        name = parse_topic(key, option)
        if isinstance(value, str) and value.lower() in ("earliest", "latest"):
            spec[name] = value.lower()
        elif (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and value[0] >= -1
            and value[1] >= -1
        ):
            spec[name] = (value[0], value[1])
        else:
            raise ConfigError(
                f"option {option}: {key!r}: expected [ledgerId, entryId] (integers >= -1), "
                f"'earliest' or 'latest', got {value!r}"
            )
    return spec


__all__ = ["READERS", "SourceOptions", "StartSpec", "parse_pattern", "parse_starting_offsets"]


def positions_only(options: Mapping[str, str]) -> bool:
    """The ``positionsOnly`` option (any letter case): rows without the entries' bytes."""
    value = next((str(v) for k, v in options.items() if k.lower() == "positionsonly"), "")
    return parse_bool(value.strip() or "false", "positionsOnly")
