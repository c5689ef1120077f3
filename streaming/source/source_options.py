"""The options of the Pulsar source (``streaming/source/pulsar_source.py``), parsed and checked in plain Python:
:class:`SourceOptions`, the ``startingOffsets``/``endingOffsets`` and ``topicsPattern`` syntaxes. Each error is
one line naming the option. :data:`OPTIONS` says what each option does: ``scripts/gen_source_options.py`` writes
it to ``docs/source-options.md``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from streamoffload.codecs.compression import MAX_MESSAGE_SIZE
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.codecs.topics import TopicName
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
from streamoffload.streaming.governance.rate_limits import RateLimitSpec
from streamoffload.streaming.source.option_values import (
    parse_bool,
    parse_positive,
    parse_seconds,
    parse_size,
    parse_topic,
)

READERS = ("raw", "client")
OUTPUT_MESSAGES = "messages"
OUTPUT_ENTRIES = "entries"
OUTPUTS = (OUTPUT_MESSAGES, OUTPUT_ENTRIES)
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
    output: str = OUTPUT_MESSAGES
    """``output``: one row per message in pulsar-spark's columns, or (``entries``) one per entry with its bytes;
    ``positions_only`` rows instead of either."""
    max_message_size: int = MAX_MESSAGE_SIZE
    """``maxMessageSize``: the broker's; a compressed payload inflates to at most this plus the batch framing."""
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
    """``rateLimits`` (the offload job's): where the tasks find the read limits
    (``streaming.governance.rate_limits``)."""

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
        if client:  # fail now, on the driver, not in a task; none to check costs no pulsar-client import (~0.4 s)
            client_kwargs(dict(client))
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
            output=output_of(options),
            max_message_size=_max_message_size(get("maxMessageSize")),
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


def _max_message_size(text: str | None) -> int:
    if text is None:
        return MAX_MESSAGE_SIZE
    size = parse_size(text, "maxMessageSize")
    if size <= 0:
        raise ConfigError(f"option maxMessageSize must be positive, got {text!r}")
    return size


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
        elif (
            isinstance(value, list)
            and len(value) > 2
            and all(isinstance(v, int) and not isinstance(v, bool) and -128 <= v <= 255 for v in value)
        ):
            spec[name] = _message_id_position(value, key, name, option)
        else:
            raise ConfigError(
                f"option {option}: {key!r}: expected [ledgerId, entryId] (integers >= -1), the bytes of a "
                f"serialized MessageId (pulsar-spark's offsets), 'earliest' or 'latest', got {value!r}"
            )
    return spec


_LONG_MAX = (1 << 63) - 1


def _java_long(value: int) -> int:
    """A ``uint64`` field as the Java client's ``long`` (``MessageId.earliest`` writes -1 as 2**64 - 1)."""
    return value - (1 << 64) if value > _LONG_MAX else value


def _message_id_position(value: list[int], key: str, topic: str, option: str) -> Position | str:
    """pulsar-spark's offset, the bytes of a serialized ``MessageId`` (``JsonUtils.topicOffsets``: Java's signed
    bytes), as a position. pulsar-spark reads a given start's entry whole, from its first message (it keeps the
    ledger, entry and partition of the id, not the batch index), and an end's entry whole, to its last message:
    a start is the position before its entry, an end its entry. ``MessageId.earliest`` and ``MessageId.latest``
    are the words."""
    try:
        mid = MessageIdData.FromString(bytes(v & 0xFF for v in value))
    except DecodeError as err:
        raise ConfigError(f"option {option}: {key!r}: not a serialized MessageId: {err}") from None
    ledger, entry = _java_long(mid.ledgerId), _java_long(mid.entryId)
    if (ledger, entry) == (-1, -1):
        if option == "endingOffsets":
            raise ConfigError(f"option {option}: {key!r}: MessageId.earliest is not an end")
        return "earliest"
    if (ledger, entry) == (_LONG_MAX, _LONG_MAX):
        return "latest"
    if ledger < 0 or entry < 0:
        raise ConfigError(f"option {option}: {key!r}: MessageId {ledger}:{entry} is not a position")
    partition = TopicName.parse(topic).partition
    if mid.HasField("partition") and mid.partition >= 0 and partition >= 0 and mid.partition != partition:
        raise ConfigError(
            f"option {option}: {key!r}: the MessageId is of partition {mid.partition}, not of partition {partition}"
        )
    return (ledger, entry) if option == "endingOffsets" else (ledger, entry - 1)


__all__ = ["READERS", "SourceOptions", "StartSpec", "parse_pattern", "parse_starting_offsets"]


def positions_only(options: Mapping[str, str]) -> bool:
    """The ``positionsOnly`` option (any letter case): rows without the entries' bytes."""
    value = next((str(v) for k, v in options.items() if k.lower() == "positionsonly"), "")
    return parse_bool(value.strip() or "false", "positionsOnly")


def output_of(options: Mapping[str, str]) -> str:
    """The ``output`` option (any letter case): ``messages`` (the default) or ``entries``; refused with
    ``positionsOnly``, whose rows are neither."""
    given = next((str(v).strip() for k, v in options.items() if k.lower() == "output"), "")
    if not given:
        return OUTPUT_MESSAGES
    if positions_only(options):
        raise ConfigError(f"option output={given!r} does not go with positionsOnly=true (its rows are positions)")
    output = given.lower()
    if output not in OUTPUTS:
        raise ConfigError(f"option output: expected messages or entries, got {given!r}")
    return output


@dataclass(frozen=True)
class OptionDoc:
    """One entry of the options reference (``docs/source-options.md``, written by ``scripts/gen_source_options.py``):
    the option's names (any letter case; pulsar-spark's aliases after the first), its default, one line for the
    table and the rest of what it does."""

    names: tuple[str, ...]
    default: str
    summary: str
    details: str = ""


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc(
        ("serviceUrl", "service.url"),
        "required",
        "The broker: ``pulsar://host:port`` or ``pulsar+ssl://host:port`` (``service.url`` is pulsar-spark's name).",
    ),
    OptionDoc(
        ("admin.url",),
        "",
        "pulsar-spark's admin API address: accepted and unused (nothing here needs the admin API).",
    ),
    OptionDoc(
        ("topics", "topic"),
        "",
        "Comma-separated topic names (``topic``: pulsar-spark's name, one topic); give this or ``topicsPattern``.",
        "Short names mean ``persistent://public/default/NAME``. A partitioned topic is expanded to its partitions "
        "through the broker's partition metadata, and re-expanded every ``discoveryIntervalSeconds``, so added "
        "partitions are picked up.\n\n"
        "Topics that do not exist: with the raw reader the source never creates a topic (its subscriptions set "
        "``force_topic_creation`` false, as Pulsar's own pattern consumers do), so asking about a deleted topic "
        "does not bring it back (``reader=client``'s ``pulsar-client`` readers may create it where the broker "
        "allows auto-creation). A topic the broker says does not exist is read as empty. One that was read before "
        "and is now gone was deleted: the source lets go of it with one warning, keeps its position (a topic "
        "created again under the name is read after it) and lists the namespace again at the next trigger; "
        "nothing is reported lost.",
    ),
    OptionDoc(
        ("topicsPattern",),
        "",
        "A regular expression for the topics of one namespace; give this or ``topics``.",
        "``persistent://tenant/ns/REGEX``, ``tenant/ns/REGEX`` or just ``REGEX`` (``public/default``). It must match "
        "a topic's whole local name (or, for a partition, its base topic's). Topics are listed with the binary "
        "protocol's ``GetTopicsOfNamespace`` (what Pulsar's clients use for patterns; no admin API needed) every "
        "``discoveryIntervalSeconds``, so new topics are picked up while running.",
    ),
    OptionDoc(
        ("topicsPatternCandidates",),
        "",
        "With ``topicsPattern`` on pulsar-lite, which cannot list a namespace: the names the pattern filters.",
        "pulsar-lite 0.2 does not answer ``GetTopicsOfNamespace``: there the pattern filters this comma list of "
        "names, each expanded like ``topics``. A candidate without data is read as an empty topic and picked up "
        "when data arrives; topics outside the list cannot be discovered.",
    ),
    OptionDoc(
        ("startingOffsets",),
        "earliest",
        "Where a query without a checkpoint starts: ``earliest``, ``latest`` or JSON of positions.",
        "``earliest`` (offloading starts with the history), ``latest``, or JSON mapping topic-partition names to "
        "``[ledgerId, entryId]`` -- the last position already processed, so reading starts after it (``[L, -1]`` "
        'starts at ledger L\'s first entry) -- or to ``"earliest"`` / ``"latest"``. The key ``"*"`` '
        '(``"earliest"`` or ``"latest"``) sets the start of the topic-partitions the JSON does not name; without it '
        "they start at the earliest position. Only used when a query starts without a checkpoint.\n\n"
        "pulsar-spark's offsets are taken too: a topic-partition mapped to the bytes of a serialized ``MessageId`` "
        "(``JsonUtils.topicOffsets``, e.g. ``[8,11,16,101,24,1,32,1]``; Java's signed bytes, or 0-255), such as a "
        "row's ``__messageId``. As in pulsar-spark the read starts at that message's entry, all of it (a batch "
        "index is not used); ``MessageId.earliest`` and ``MessageId.latest`` are ``earliest`` and ``latest``.",
    ),
    OptionDoc(
        ("startingTime",),
        "",
        "Instead of ``startingOffsets``: start at the first entry published at or after this time.",
        "Milliseconds since the epoch, or ISO-8601 (UTC unless it says otherwise). The entry is found in the store "
        "(with ``offloaded.store``) or on the broker by a binary search over probed entries, not by reading the "
        "history (``streaming/source/starting_time.py``; publish times are assumed to grow along a "
        "topic-partition, as Pulsar's seek by time assumes). A topic-partition with nothing that recent starts "
        "after its latest entry. Only used when a query starts without a checkpoint.",
    ),
    OptionDoc(
        ("endingOffsets",),
        "latest",
        'Batch reads only (as in pulsar-spark): where ``spark.read.format("pulsar")`` stops, inclusive.',
        "``latest`` (what the broker holds when the read is planned) or JSON mapping topic-partitions to "
        '``[ledgerId, entryId]`` or ``"latest"``, with ``"*"`` for those not named, or (pulsar-spark\'s) to a '
        "serialized ``MessageId``'s bytes: the read ends with that message's entry, all of it, as in pulsar-spark. "
        "A streaming query refuses it: it reads on as data arrives.",
    ),
    OptionDoc(
        ("output",),
        OUTPUT_MESSAGES,
        "``messages``: a row per message in pulsar-spark's columns; ``entries``: a row per entry, with its bytes.",
        "``messages``: ``value`` (binary; null for a null value), ``__key`` (binary), ``__topic``, ``__messageId`` "
        "(the Java client's serialized ``MessageIdData``: ledger, entry, partition, batch index and size), "
        "``__publishTime``, ``__eventTime`` (null when unset), ``__messageProperties`` (map), as pulsar-spark "
        "gives them, then ``__ledgerId``, ``__entryId``, ``__batchIndex`` (-1 if not batched), ``__sequenceId``, "
        "``__producerName``: the ``pulsar-offloaded`` source's columns. Batches are split and compressed payloads "
        "inflated (LZ4, ZLIB, ZSTD, SNAPPY); an end-to-end encrypted entry fails the read, naming it. "
        "``entries``: ``topic, partition, ledger_id, entry_id, publish_time, num_messages, entry, size``, "
        "``entry`` holding the entry in Pulsar's headers-and-payload format (``codecs.entry.entry_messages`` "
        "splits it). Not with ``positionsOnly``, whose rows are positions.",
    ),
    OptionDoc(
        ("maxMessageSize",),
        "5 MiB",
        "The broker's ``maxMessageSize``: with ``output=messages`` a compressed payload inflates to at most this "
        "plus 1 MiB of batch framing; one that declares more fails, naming its entry.",
    ),
    OptionDoc(
        ("offloaded.store", "offloaded.s3.endpoint", "offloaded.s3.region", "offloaded.keysFile"),
        "",
        "Read through the tier: what the broker no longer holds is read from this offload store.",
        "The store is ``file:///dir`` or ``s3://bucket/prefix``, with the S3 endpoint and region of an "
        "S3-compatible store; ``offloaded.keysFile`` holds the keys of segments encrypted at rest "
        "(``checkpoints.keyring``). A range is read from the store wherever it holds the next entry and from the "
        "broker elsewhere: a query from ``earliest``, a position or ``startingTime`` before the broker's first "
        "entry reads the stored segments (through the read path's read-ahead, cache and checks) and goes on from "
        "the broker at the entry after the last stored one: one stream, the same rows, every entry once, in order "
        "(ledger entries are immutable, so both places hold the same bytes). A topic-partition's latest position "
        "is the later of the broker's and the store's. ``failOnDataLoss`` then fires only for entries in neither, "
        "naming the ledger range (``streaming/source/read_through.py``). Not with ``positionsOnly``.",
    ),
    OptionDoc(
        ("failOnDataLoss",),
        "true",
        "Fail when entries that should exist are gone; ``false``: log, skip and go on.",
        "Gone means a gap of entry ids within a ledger, a ledger not starting at entry 0, the range's known last "
        "entry missing, or a topic-partition whose latest position went backwards.",
    ),
    OptionDoc(
        ("maxEntriesPerTrigger", "maxBytesPerTrigger"),
        "",
        "Admission control through Spark's ``ReadLimit``: at most this many entries, or about this many bytes, "
        "per micro-batch.",
        "Entries are counted exactly (with ``output=messages`` too: a limit counts entries, not rows); bytes are "
        "estimated from sampled entry sizes (the driver never sees the "
        "entries). The limit is split max-min fairly across the topic-partitions with data, leftovers rotating. A "
        "single entry larger than ``maxBytesPerTrigger`` is still admitted, alone, so nothing stalls. "
        "``Trigger.AvailableNow`` stops at the positions that were latest when the query started. Without either "
        "(and without ``bufferFile``) a micro-batch takes everything available; the offload job always passes "
        "``maxBytesPerTrigger`` (``pulsar.max_bytes_per_trigger``, default 1 GiB).",
    ),
    OptionDoc(
        ("reader",),
        "raw",
        "``raw``: entries over Pulsar's binary protocol, byte for byte; ``client``: rebuilt by ``pulsar-client``.",
        "``raw`` reads entries over the binary protocol and stores them as the broker sends them "
        "(``raw_reader.read_range_raw``); the driver's position lookups and probes use the same protocol. "
        "``client`` uses the ``pulsar-client`` reader, which rebuilds each entry from its messages "
        "(``client_reader.read_range``; compression is dropped, sequence ids renumbered), for clusters whose "
        "authentication the raw reader does not speak (OAuth2, custom plugins). Topic discovery uses "
        "``pulsar-client`` and the binary protocol's topic listing either way.",
    ),
    OptionDoc(
        ("pulsar.client.*",),
        "",
        "Passed to ``pulsar.Client`` and, with ``reader=raw``, to the raw reader's connections.",
        "Auth, TLS and timeouts (``client_options.client_kwargs``); the raw reader speaks token, basic and TLS "
        "auth, the ``pulsar+ssl://`` settings and the timeouts (``client_options.ConnectionConfig``).",
    ),
    OptionDoc(
        ("pulsar.reader.*",),
        "",
        "pulsar-spark's reader settings: ``receiverQueueSize`` is used, ``readCompacted = true`` is refused.",
        "``pulsar.reader.receiverQueueSize`` sets ``receiverQueueSize``; ``readerName``, "
        "``subscriptionRolePrefix``, ``subscriptionName`` and ``cryptoFailureAction`` are accepted and have no "
        "effect (no subscription is named; encrypted entries are carried as the broker stores them); "
        "``readCompacted = true`` is refused (an offloader reads the whole log). Other names are refused.",
    ),
    OptionDoc(
        ("stallTimeoutMs",),
        "200",
        "Reader tuning: the silence that counts as a stalled reader.",
    ),
    OptionDoc(
        ("receiverQueueSize",),
        "2000",
        "Reader tuning: the reader's prefetch queue.",
    ),
    OptionDoc(
        ("retryTimeoutSeconds",),
        "60",
        "How long a read (or the driver's position lookups) keeps retrying without progress before failing.",
    ),
    OptionDoc(
        ("discoveryIntervalSeconds",),
        "10",
        "How often partitions and ``topicsPattern``'s topics are listed again.",
    ),
    OptionDoc(
        ("arrowBatchEntries", "arrowBatchBytes"),
        "2000, 32 MiB",
        "The rows, and their bytes, of one Arrow batch a task hands Spark.",
        "``arrowBatchEntries`` bounds the rows of ``output=entries`` and ``positionsOnly``; message rows come up to "
        "16,384 to a batch, as ``pulsar-offloaded``'s (splitting batches costs per entry and batch index, and "
        "needs many entries per Arrow batch to be fast). ``arrowBatchBytes`` bounds both.",
    ),
    OptionDoc(
        ("idlePollSeconds",),
        "0",
        "A topic-partition with nothing new at its last lookup is asked again only after about this long.",
        "The wait is spread over 0.75-1.25 of it by name, so a query over thousands of mostly quiet "
        "topic-partitions asks about the active ones and a slice of the rest. New entries on a quiet "
        "topic-partition are then seen up to this much later, and ``processAllAvailable`` may return before it "
        "has seen them. 0 asks about every one at every trigger; the offload job sets 2 s. "
        "``Trigger.AvailableNow`` always asks about all of them once.",
    ),
    OptionDoc(
        ("watchedPollSeconds",),
        "30",
        "With the raw reader: how often a quiet topic-partition watched by a held consumer is asked about anyway.",
        "The source holds a consumer on each topic-partition between triggers (non-durable, at the latest "
        "position, one permit), so the broker pushes it the next entry of a quiet one, and with "
        "``idlePollSeconds`` above 0 that topic-partition is asked about at the next trigger. This bounds how "
        "late an entry whose push was lost is seen (pulsar-lite's dispatch stalls at times). ``0`` holds no "
        "consumer: each lookup subscribes and unsubscribes, and quiet topic-partitions are asked every "
        "``idlePollSeconds``. A held consumer counts as a connected consumer to the broker: ``pulsar-admin topics "
        'delete`` without ``--force`` refuses such a topic ("Topic has 1 connected producers/consumers") and the '
        "broker's inactive-topic cleanup passes it by; use ``--force`` (the source lets go of a deleted topic) or "
        "set 0.",
    ),
    OptionDoc(
        ("minPartitions",),
        "1",
        "As in Spark's Kafka source: at least this many input partitions per micro-batch.",
        "A micro-batch with fewer topic-partition ranges cuts the largest in pieces read by separate tasks "
        "(``streaming/source/input_partitions.py``; only where the entries are known to exist, so loss is still "
        "detected). Rows of one topic-partition then come from several input partitions, in position order "
        "across them.",
    ),
    OptionDoc(
        ("maxPartitions",),
        str(DEFAULT_MAX_PARTITIONS),
        "At most this many input partitions (Spark tasks) per micro-batch; never below ``minPartitions``.",
        "A micro-batch with more topic-partition ranges packs them into groups of about equal weight, each read "
        "by one task range after range (``streaming/source/input_partitions.py``). A task costs far more than "
        "reading a small range, so a query over thousands of mostly quiet topic-partitions must not run a task "
        "for each. The offload job sets it to Spark's default parallelism (a task per core).",
    ),
    OptionDoc(
        ("policyVersionsFile",),
        "",
        "The offload job's policy versions (``streaming.governance.policy_versions``): ``enabled = false`` pauses.",
        "A topic-partition whose policy in force says ``enabled = false`` is paused: its offset does not advance, "
        "so nothing is read (or skipped) until it is enabled again.",
    ),
    OptionDoc(
        ("quarantineFile",),
        "",
        "The offload job's quarantined topics (``streaming.governance.quarantine``): paused until their backoff ends.",
        "A quarantined topic-partition's offset does not move and nothing is skipped; the other topics go on.",
    ),
    OptionDoc(
        ("bufferFile",),
        "",
        "The offload job's per-topic-partition offload buffers: admission enforces the policy's buffer bound.",
        "A JSON file the offload job rewrites after every micro-batch (``admission.write_buffer_file``): each "
        "topic-partition's offload buffer (``buffered_bytes``: bytes the segmenter accepted but has not uploaded) "
        "and the store's minimum part size. Admission control then enforces the buffer bound of the policy in "
        "force (``offloadBufferMaxBytes``, from ``policyVersionsFile``, else the default): a topic-partition is "
        "admitted at most ``bound - buffered_bytes`` more bytes per micro-batch (at least one entry while below "
        "the bound), and none at or above it. The bound used is at least one block plus one minimum part, the "
        "most the segmenter can hold between micro-batches (a full block waiting for the entry that does not fit, "
        "and complete blocks short of a part), so a topic-partition is never refused for a buffer that only "
        "drains when new entries arrive.",
    ),
    OptionDoc(
        ("rateLimits",),
        "",
        "The offload job's read limits (``streaming.governance.rate_limits``): where the tasks find them.",
    ),
    OptionDoc(
        ("keyPrefix",),
        "",
        "The store's key prefix: a topic found by ``topicsPattern`` whose keys the store cannot hold is skipped.",
    ),
    OptionDoc(
        ("positionsOnly",),
        "false",
        "``true`` (the offload job): rows describe their entry without carrying it, with its CRC-32C.",
        "Rows are ``topic, partition, ledger_id, entry_id, publish_time, num_messages, size, crc32c`` (no "
        "``entry`` column; ``crc32c`` is the CRC-32C of the entry's stored bytes, computed as they are read). The "
        "offload job's sink fetches the bytes itself and checks them against these "
        "(``streaming/sink/entry_fetch.py``), so no payload byte passes through Spark.",
    ),
    OptionDoc(
        ("spoolDir", "spoolMaxBytes"),
        "unset, 2 GiB",
        "With ``positionsOnly``: each task also keeps the entries it reads in a spool file for the sink.",
        "The spool file is private to the task, under ``spoolDir`` (``streaming/handoff/spool.py``), written while "
        "the spool holds less than ``spoolMaxBytes``, so a sink on the same machine need not read the entries "
        "from the broker again.",
    ),
    OptionDoc(
        ("sealAtEnd",),
        "false",
        "``true`` (``run --once``), with ``Trigger.AvailableNow``: seal markers in the last micro-batch.",
        "Once the query has read entries, the micro-batch that reaches every topic-partition's AvailableNow target "
        "also carries seal markers, one row per topic-partition with ``ledger_id = -1``, ``entry_id = -1`` and no "
        'entry (the offset gains ``"sealedAtEnd": true``). When it has nothing more to read without reaching them '
        "all (a topic-partition paused meanwhile), the markers come in one more micro-batch of their own. The job "
        "turns each marker into a seal of that topic-partition's open segment, after that topic-partition's "
        "entries of the same micro-batch, so a batch run drains and seals in one query.",
    ),
    OptionDoc(
        ("backlogFile",),
        "",
        "A JSON file of the backlog, rewritten atomically at every trigger and commit, for a dashboard elsewhere.",
        "The backlog per topic-partition: the latest position, the position consumed, ``entries`` and ``bytes`` "
        "behind (``PulsarStreamReader.backlog``; read it with ``backlog.read_backlog_file``).",
    ),
)
"""The options reference: every option :meth:`SourceOptions.parse` reads, in the order the doc lists them."""
