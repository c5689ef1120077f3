"""Configuration: one TOML file with the Pulsar connection, the topics, the store, Spark settings and
the offload policy at broker, namespace and topic level (the most specific level wins).

Policy keys use Pulsar's own names where they exist. Every problem is reported as a ``ConfigError``
naming the key and the file. The running job re-reads the file when it changes (``PolicySource``), so
policy changes need no restart; connection, store and Spark settings are read once at start.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.policy import (
    DEFAULT_MAX_MESSAGE_SIZE,
    JOB_ONLY_KEYS,
    MAX_BLOCK_BYTES,
    RATE_KEYS,
    OffloadPolicy,
    check_block_size,
    validated_policy,
)
from streamoffload.codecs.positions import MAX_ID
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.errors import ConfigError, StreamOffloadError
from streamoffload.pulsar_names import (
    POLICY,
    REFUSED,
    STORE_NAMES,
    THRESHOLD_KEYS,
    THRESHOLD_PROBLEM,
    Alias,
    aliases_in,
    house_name,
)
from streamoffload.storage.fs_sync import SYNC_MODES
from streamoffload.storage.location import StoreLocation, is_url, parse_store_url
from streamoffload.units import DAY_MS, MIB, MINUTE_MS, parse_duration_ms, parse_size

DRIVERS = ("filesystem", "aws-s3", "s3")
"""Driver names, matched without case as Pulsar matches them (``"S3"`` is ``s3``)."""


_POLICY_TYPES: dict[str, type] = typing.get_type_hints(OffloadPolicy)
"""The policy keys and their types; the values' rules are ``checkpoints.policy``'s."""
_POLICY_ALIASES: dict[str, Alias] = aliases_in(POLICY)
"""Other names of policy keys (``streamoffload.pulsar_names``)."""
_DURATION_KEYS: dict[str, int] = {
    # Keys that also take a duration string ("90s", "4h", "1h30m"): milliseconds per unit of the key.
    "maxOffloadSegmentRolloverTimeMinutes": MINUTE_MS,
    "retentionTimeInMinutes": MINUTE_MS,
    "managedLedgerOffloadDeletionLagMs": 1,
}
_SIZE_KEYS: dict[str, int] = {
    # Keys that also take a size string ("64MiB", "1g", "512 KiB"): bytes per unit of the key.
    "maxSizePerOffloadSegmentMbytes": MIB,
    "retentionSizeInMB": MIB,
    "managedLedgerOffloadMaxBlockSizeInBytes": 1,
    "managedLedgerOffloadReadBufferSizeInBytes": 1,
    "offloadBufferMaxBytes": 1,
    **{key: 1 for key in RATE_KEYS},  # bytes per second: "10MiB" is 10 MiB/s
}


def _size_bytes(text: str) -> float:
    """Bytes in a size string (``streamoffload.units``); a number too large for a float is infinite, as it was
    when the size was a float, and refused as not finite."""
    size = parse_size(text)
    try:
        return float(size)
    except OverflowError:
        return math.inf


def parse_pattern(pattern: str, where: str = "option topicsPattern") -> tuple[str, re.Pattern[str]]:
    """``(tenant/namespace, compiled regex on local names)`` of a topics pattern (``pulsar.topics_pattern``, the
    source's ``topicsPattern``): ``[persistent://]tenant/namespace/REGEX`` or ``REGEX`` (public/default).
    ``ConfigError`` starting with ``where`` otherwise."""
    text = pattern.strip()
    if "://" in text:
        domain, _, text = text.partition("://")
        if domain != "persistent":
            raise ConfigError(f"{where}: only persistent topics can be read, not {domain}://")
    parts = text.split("/", 2)
    if len(parts) == 3:
        namespace, regex = f"{parts[0]}/{parts[1]}", parts[2]
    elif len(parts) == 1:
        namespace, regex = "public/default", parts[0]
    else:
        raise ConfigError(f"{where}: expected [persistent://]tenant/namespace/REGEX or REGEX, got {pattern!r}")
    try:
        return namespace, re.compile(regex)
    except re.error as err:
        raise ConfigError(f"{where}: bad regular expression {regex!r}: {err}") from err


_INTERVAL_UNIT_MS = {
    "week": 7 * DAY_MS,
    "day": DAY_MS,
    "hour": 60 * MINUTE_MS,
    "minute": MINUTE_MS,
    "second": 1000,
    "millisecond": 1,
    "microsecond": 0.001,
}
_INTERVAL_PART = re.compile(rf"\+?(\d+(?:\.\d+)?)\s+({'|'.join(_INTERVAL_UNIT_MS)})s?", re.IGNORECASE)
_INTERVAL_RE = re.compile(
    rf"^\s*(?:interval\s+)?{_INTERVAL_PART.pattern}(?:\s+{_INTERVAL_PART.pattern})*\s*$", re.IGNORECASE
)
MAX_TRIGGER_INTERVAL_MS = 2**63 - 1
"""A Spark processing-time trigger keeps its interval in a Java long of milliseconds."""


def check_trigger_interval(text: str, where: str = "--trigger-interval") -> None:
    """Refuse what Spark's processing-time trigger would refuse when the query starts: the interval is Spark's
    own syntax, ``[interval] N unit [N unit ...]`` with units week, day, hour, minute, second, millisecond and
    microsecond (plural or not), fractions of seconds only, never negative (``5 seconds``, ``1 minute 30
    seconds``, ``500 milliseconds``). ``ConfigError`` starting with ``where`` and naming the value."""
    parts = _INTERVAL_PART.findall(text) if isinstance(text, str) and _INTERVAL_RE.match(text) else []
    fraction = any("." in number and unit.lower() != "second" for number, unit in parts)
    total = sum(float(number) * _INTERVAL_UNIT_MS[unit.lower()] for number, unit in parts)
    if not parts or fraction or total > MAX_TRIGGER_INTERVAL_MS:
        raise ConfigError(
            f"{where} {text!r}: expected a Spark interval such as '5 seconds', '1 minute 30 seconds' or "
            "'500 milliseconds' (units: week, day, hour, minute, second, millisecond, microsecond; fractions of "
            "seconds only)"
        )


def parse_metrics_address(address: str, where: str = "metrics address") -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback) into (host, port); ``ConfigError`` starting with
    ``where`` and naming the value otherwise."""
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{where} {address!r}: expected host:port, e.g. 127.0.0.1:9464")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


DEFAULT_MAX_BYTES_PER_TRIGGER = 1024 * MIB
"""pulsar.max_bytes_per_trigger by default. Micro-batches carry positions, not bytes (the sink fetches those
one part at a time), so a large figure costs no memory and amortises Spark's fixed cost per micro-batch."""


@dataclass(frozen=True)
class PulsarSettings:
    service_url: str = "pulsar://127.0.0.1:6650"
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    topics_pattern_candidates: tuple[str, ...] = ()
    """For a broker that cannot list a namespace's topics (pulsar-lite): the names the pattern filters."""
    starting_offsets: str = "earliest"
    max_entries_per_trigger: int | None = None
    """At most this many entries per micro-batch, split fairly over the topic-partitions; none by default."""
    max_bytes_per_trigger: int | None = DEFAULT_MAX_BYTES_PER_TRIGGER
    """About this many entry bytes per micro-batch (split fairly over the topic-partitions), so a backlog of
    any size is read in bounded micro-batches. Rows carry positions, not bytes, so it hardly moves memory
    (README "Memory"): it sets how much the broker must still hold between the source's read and the sink's."""
    fail_on_data_loss: bool = True
    watch_quiet_topics: bool = True
    """The source holds a consumer on each quiet topic-partition between triggers, so the broker tells it of a new
    entry at once (the source's ``watchedPollSeconds``). Pulsar counts it as a connected consumer: a plain
    ``topics delete`` is refused until ``--force``, and inactive-topic cleanup passes the topic by. False: no
    consumer is held, and quiet topic-partitions are asked about every ~2 s instead."""
    retain_subscription: str = ""
    """A durable subscription the job keeps on each offloaded topic-partition, acknowledged up to the last
    committed position after every commit, so that the broker's retention does not delete what the store
    does not have yet (the sink reads the entries a second time). Empty (default): none."""
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    """The broker's ``maxMessageSize`` (Pulsar's default 5 MiB): the largest entry it accepts. Every block size
    the policies can apply must hold such an entry, or the job would stop at the first one
    (``checkpoints.policy.check_block_size``); a broker configured for smaller messages lets smaller blocks through."""
    client: Mapping[str, str] = field(default_factory=dict)
    """Passed to the source as ``pulsar.client.<key>`` (auth, TLS)."""


@dataclass(frozen=True)
class StoreSettings:
    managedLedgerOffloadDriver: str = "filesystem"
    root: str = "var/store"
    """Filesystem driver: the directory objects are written under."""
    bucket: str | None = None
    prefix: str = ""
    serviceEndpoint: str | None = None
    region: str | None = None
    pathStyle: bool = False
    fileMode: str = "0600"
    """Filesystem driver: permissions of the files the store creates (octal text, at least "0600")."""
    dirMode: str | None = None
    """Filesystem driver: permissions of its directories; by default the one that goes with ``fileMode``
    (each class that may read files may enter directories: "0600" -> "0700", "0640" -> "0750")."""
    fileSync: str = "group"
    """Filesystem driver: how writes are made durable. "group" (default): one ``syncfs`` shared by the writers
    that wait at once (Linux; it also writes back other programs' dirty data on that filesystem sooner); "file":
    an fsync per file (docs/DESIGN.md, "Durable writes on a filesystem")."""

    def __post_init__(self) -> None:
        self.modes()  # refuse a malformed mode when the configuration is read, not at the first write
        if self.fileSync not in SYNC_MODES:
            modes = ", ".join(map(repr, SYNC_MODES))
            raise ConfigError(f"store.fileSync must be one of {modes}, got {self.fileSync!r}")

    def modes(self) -> tuple[int, int | None]:
        """``(file_mode, dir_mode)`` of the filesystem driver; ``ConfigError`` naming the key if malformed."""
        out: list[int | None] = []
        for key, text, least in (("fileMode", self.fileMode, 0o600), ("dirMode", self.dirMode, 0o700)):
            if text is None:
                out.append(None)
                continue
            if not isinstance(text, str) or not re.fullmatch(r"0?o?[0-7]{3}", text.strip()):
                raise ConfigError(f'store.{key} must be an octal permission mode such as "{least:04o}", got {text!r}')
            mode = int(text.strip().replace("o", "")[-3:], 8)
            if mode & least != least:
                raise ConfigError(
                    f"store.{key} {text!r} must give the store's owner at least {least:04o}"
                    f" (the job reads and writes what it creates)"
                )
            out.append(mode)
        assert out[0] is not None
        return out[0], out[1]

    @property
    def location(self) -> StoreLocation:
        """Where this configuration says the store is (a filesystem root resolved against the current directory
        now). A filesystem store has no key prefix; ``prefix`` is the S3 drivers'."""
        if self.managedLedgerOffloadDriver == "filesystem":
            file_mode, dir_mode = self.modes()
            return StoreLocation(
                "file",
                path=str(Path(self.root).resolve()),
                file_mode=file_mode,
                dir_mode=dir_mode,
                sync=None if self.fileSync == "group" else self.fileSync,
            )
        return StoreLocation(
            "s3",
            bucket=self.bucket or "",
            prefix=self.prefix.strip("/"),
            endpoint=self.serviceEndpoint,
            region=self.region,
            path_style=self.pathStyle,
        )


CLASS_ARCHIVE_AUTO = "auto"
"""``[spark] classArchive``'s default: the user's cache (``streaming.job.class_archive.archive_directory``)."""


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[2]"
    checkpoint: str = "var/checkpoint"
    trigger_interval: str = "5 seconds"
    spool: bool = True
    """On ``local`` masters, the source tasks keep the bytes they read in a spool beside the checkpoint for the
    sink (``streaming.handoff.spool``), so the broker sends each entry once; false: the sink reads it again."""
    overlap_writes: bool = True
    """On ``local`` masters, the sink writes a micro-batch on a driver thread while Spark reads the next one from
    the broker (``streaming.sink.pipeline``); false: each micro-batch's writes end before the next one reads."""
    class_archive: str = CLASS_ARCHIVE_AUTO
    """Where the driver JVM's classes are kept between runs (a class-data archive: a run's start-up in about half
    the time; ``streaming.job.class_archive``): ``auto``, the user's cache (``$XDG_CACHE_HOME/streamoffload/jvm``);
    a directory; or empty for none."""
    conf: Mapping[str, str] = field(default_factory=dict)


DEFAULT_TOPIC_SERIES = 100
"""metrics.topic_series by default: at ~16 series per topic-partition, about 1,600 of a scrape's series."""
MAX_TOPIC_SERIES = 1_000_000
"""metrics.topic_series at most (a bound against typos: a million topic-partitions is 16 million series)."""


@dataclass(frozen=True)
class MetricsSettings:
    address: str = "127.0.0.1:9464"
    """host:port of the Prometheus endpoint; empty disables it."""
    topic_series: int = DEFAULT_TOPIC_SERIES
    """Per-topic series for at most this many topic-partitions per scrape, the worst first (failing, then
    by lag and backlog: ``metrics.selection``); 0 exports none. Namespace totals always cover them all."""


@dataclass(frozen=True)
class EncryptionSettings:
    keys_file: str = ""
    """A JSON or TOML file of key-encryption keys (key id = base64 of 32 bytes) for segments whose policy names
    an ``offloadEncryptionKeyId`` (``checkpoints.keyring``); empty: keys come from the environment only
    (``STREAMOFFLOAD_KEYS_FILE``, ``STREAMOFFLOAD_KEK_<id>``)."""

    def keyring(self) -> KeyRing:
        """The configured keys, then the environment's."""
        return KeyRing.with_file(self.keys_file) or KeyRing.from_env()


DEFAULT_TABLE_SEGMENTS_PER_COMMIT = 64
"""table.segments_per_commit by default: ``table sync``'s (``table.sync.DEFAULT_SEGMENTS_PER_COMMIT``)."""
MAX_TABLE_SEGMENTS_PER_COMMIT = 1_000_000
"""table.segments_per_commit at most (as ``table sync --segments-per-commit``)."""
DEFAULT_TABLE_COMMIT_INTERVAL = "10s"
MAX_TABLE_COMMIT_INTERVAL_MS = DAY_MS
DEFAULT_TABLE_MAINTAIN_EVERY = "10m"
"""table.maintain_every by default: how often the job maintains each table it syncs."""
DEFAULT_TABLE_COMPACT_MIN_FILES = 5
"""table.compact_min_files by default (``table.maintenance.DEFAULT_MIN_FILES``)."""
DEFAULT_TABLE_COMPACT_TARGET_FILE_SIZE = "128MiB"
"""table.compact_target_file_size by default (``table.maintenance.DEFAULT_TARGET_FILE_BYTES``)."""
DEFAULT_TABLE_KEEP_SNAPSHOTS = 100
"""table.keep_snapshots by default (``table.maintenance.DEFAULT_KEEP_SNAPSHOTS``)."""
MAX_TABLE_MAINTAIN_EVERY_MS = 7 * DAY_MS
DEFAULT_TABLE_SNAPSHOT_MAX_AGE = "10m"
"""table.snapshot_max_age by default (Iceberg's ``history.expire.max-snapshot-age-ms``): one ``maintain_every``, so
each maintenance expires the snapshots of the interval before (``table maintain``'s own default is an hour). Every
snapshot a sync keeps is listed in each later ``metadata.json``, so a table committing every 10 s rewrote 360 of
them per commit within the hour (``bench/table_compaction.py``)."""
MAX_TABLE_SNAPSHOT_MAX_AGE_MS = 30 * DAY_MS


@dataclass(frozen=True)
class TableSettings:
    """Where the job keeps the Iceberg tables of topics whose policy has ``offloadTable`` on, and how often it
    commits to each (``streaming.job.tables``). ``catalog`` and ``warehouse`` are what ``streamoffload table``'s
    ``--catalog`` and ``--warehouse`` take (``table.catalog.catalog_settings``); None: the embedded SQLite catalog
    and its warehouse under a filesystem store."""

    catalog: str | None = None
    warehouse: str | None = None
    segments_per_commit: int = DEFAULT_TABLE_SEGMENTS_PER_COMMIT
    """Segments appended by one Iceberg commit at most (a crash repeats at most this many)."""
    commit_interval: str = DEFAULT_TABLE_COMMIT_INTERVAL
    """A duration ("10s", "1m", "500ms"): a table is synced at most once per interval, so sealed segments are
    coalesced into one commit (a sync behind by more than ``segments_per_commit`` segments commits as often as
    it needs to catch up)."""

    maintain_every: str = DEFAULT_TABLE_MAINTAIN_EVERY
    """A duration, or "0" (never): after a sync, a table not maintained for this long is maintained
    (``table.maintenance.maintain_table``: retention, compaction, snapshot expiry, orphan removal)."""
    compact_min_files: int = DEFAULT_TABLE_COMPACT_MIN_FILES
    """A table partition's small files are compacted once more than this many exist."""
    compact_target_file_size: str = DEFAULT_TABLE_COMPACT_TARGET_FILE_SIZE
    """A size ("128MiB"): compaction packs small files up to this per new file."""
    keep_snapshots: int = DEFAULT_TABLE_KEEP_SNAPSHOTS
    """Snapshot expiry always keeps this many of the newest (beyond them, those older than ``snapshot_max_age``
    go)."""
    snapshot_max_age: str = DEFAULT_TABLE_SNAPSHOT_MAX_AGE
    """A duration, or "0": snapshot expiry removes the snapshots older than this beyond the newest
    ``keep_snapshots`` (a reader planning on one has this long)."""

    @property
    def commit_interval_s(self) -> float:
        return parse_duration_ms(self.commit_interval) / 1000

    @property
    def maintain_every_s(self) -> float:
        """0: never."""
        return 0.0 if self.maintain_every.strip() == "0" else parse_duration_ms(self.maintain_every) / 1000

    @property
    def compact_target_file_bytes(self) -> int:
        return int(parse_size(self.compact_target_file_size))

    @property
    def snapshot_max_age_s(self) -> float:
        return 0.0 if self.snapshot_max_age.strip() == "0" else parse_duration_ms(self.snapshot_max_age) / 1000


@dataclass(frozen=True)
class Config:
    pulsar: PulsarSettings = field(default_factory=PulsarSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    broker_policy: Mapping[str, Any] = field(default_factory=dict)
    namespace_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    topic_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "<defaults>"
    """Where the configuration came from (a path), for messages."""
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)
    table: TableSettings = field(default_factory=TableSettings)

    def policy_for(self, topic: TopicName | str) -> OffloadPolicy:
        """Broker defaults, then the namespace's, then the partitioned topic's, then the partition's."""
        name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        return validated_policy(self._merged_policy(name), self.source, f"policy of {name}")

    def _merged_policy(self, name: TopicName) -> dict[str, Any]:
        merged: dict[str, Any] = dict(self.broker_policy)
        merged.update(self.namespace_policies.get(name.namespace_name, {}))
        merged.update(self.topic_policies.get(str(name.base), {}))
        if name.is_partition:
            merged.update(self.topic_policies.get(str(name), {}))
        return merged

    def with_policy_source(self, other: Config) -> Config:
        """This configuration with the policy sections of ``other`` (a re-read file)."""
        return replace(
            self,
            broker_policy=other.broker_policy,
            namespace_policies=other.namespace_policies,
            topic_policies=other.topic_policies,
        )


SUGGESTION_CUTOFF = 0.85
"""How alike (``difflib``'s ratio) an unknown key and a known one must be for "did you mean": a typo
(``topic_serie``: 0.96), not a different key that shares a long prefix (``s3ManagedLedgerOffloadBucket`` and
``managedLedgerOffloadDriver``: 0.78)."""


def _suggest(key: str, known: list[str]) -> str:
    """`` (did you mean 'X'?)`` for the known key most like ``key`` (letter case aside), if it is that close."""
    by_lower = {name.lower(): name for name in reversed(known)}  # the first spelling of a name wins
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=SUGGESTION_CUTOFF)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def _check_type(value: Any, expected: type, key: str, source: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value) and expected in (int, float):
        raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits (a policy document's JSON allows it)
            raise ConfigError(
                f"{source}: {key} must be a finite number, got an integer of {value.bit_length()} bits"
            ) from None
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise ConfigError(f"{source}: {key} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse_unit_string(value: str, key: str, where: str, source: str) -> float:
    """A duration or size string as a number in ``key``'s own unit."""
    try:
        if key in _DURATION_KEYS:
            return parse_duration_ms(value) / _DURATION_KEYS[key]
        if key in _SIZE_KEYS:
            return _size_bytes(value) / _SIZE_KEYS[key]
    except ValueError as err:
        raise ConfigError(f"{source}: {where}: {err}") from None
    raise AssertionError(key)


def _threshold_enabled(value: object, where: str, source: str) -> bool:
    """Pulsar's offload threshold as ``enabled``: -1 (no automatic offload) is false, 0 (offload as soon as
    possible, what this job does) true; a positive threshold is refused (``pulsar_names.THRESHOLD_PROBLEM``)."""
    number: int = _check_type(value, int, where, source)
    if number > 0:
        raise ConfigError(f"{source}: {where} = {number} {THRESHOLD_PROBLEM}")
    return bool(number == 0)


_POLICY_NAMES = [*_POLICY_TYPES, *_POLICY_ALIASES]
"""Every name a policy table accepts, for suggestions."""


def _normalise_policy(table: Mapping[str, Any], source: str, section: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # our key -> the name it was given under in this table
    for key, value in table.items():
        where = f"{section}.{key}"
        alias = _POLICY_ALIASES.get(key)
        target = alias.target if alias is not None else key
        if target not in _POLICY_TYPES:
            if key in STORE_NAMES or key in {f.name for f in fields(StoreSettings)}:
                raise ConfigError(f"{source}: {where} is a store setting: set it in [store] (one store for the job)")
            raise ConfigError(f"{source}: unknown offload policy key {where}{_suggest(key, _POLICY_NAMES)}")
        if target in given:
            raise ConfigError(f"{source}: {section}.{given[target]} and {where} both set {target}: give one of them")
        given[target] = key
        if key in THRESHOLD_KEYS:
            value = _threshold_enabled(value, where, source)
        elif isinstance(value, str) and (target in _DURATION_KEYS or target in _SIZE_KEYS):
            value = _parse_unit_string(value, target, where, source)
            if _POLICY_TYPES[target] is int and not value.is_integer():
                unit = "ms" if target in _DURATION_KEYS else "bytes"
                raise ConfigError(f"{source}: {where} must be a whole number of {unit}, got {table[key]!r}")
        elif alias is not None and alias.factor != 1:
            value = _check_type(value, float, where, source) * alias.factor
        if target in JOB_ONLY_KEYS and section != "offload":
            raise ConfigError(
                f"{source}: {where} is a limit of the whole job: set it in [offload], not per namespace or topic "
                f"(per topic-partition: {target.replace('Total', '')})"
            )
        out[target] = _check_type(value, _POLICY_TYPES[target], where, source)
    return out


def _section(doc: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: [{name}] must be a table, got {type(value).__name__}")
    return value


_COUNT_SETTINGS: dict[str, bool] = {
    # Optional positive counts: key -> whether size strings ("256MiB") are accepted.
    "pulsar.max_entries_per_trigger": False,
    "pulsar.max_bytes_per_trigger": True,
    "pulsar.max_message_size": True,
}


def _count_setting(value: Any, where: str, source: str, sizes: bool) -> int:
    """A positive whole number (at most a Java long), given as a number or, for sizes, a size string."""
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = _size_bytes(text) if sizes else float(int(text))
        except ValueError:
            expected = "a byte count like 268435456 or 256MiB" if sizes else "a whole number"
            raise ConfigError(f"{source}: {where} must be {expected}, got {value!r}") from None
    number = _check_type(number, int, where, source)
    if not 1 <= number <= MAX_ID:
        raise ConfigError(f"{source}: {where} must be between 1 and {MAX_ID}, got {value!r}")
    return int(number)


def file_system_root(value: object, where: str, source: str) -> str:
    """Pulsar's ``fileSystemURI`` as the filesystem store's ``root``: ``file:///dir`` or a path; another scheme
    (Pulsar's HDFS offloader's ``hdfs://``) is refused."""
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {where} must be a string, got {type(value).__name__} {value!r}")
    if not is_url(value):
        return value
    if value.partition("://")[0].lower() != "file":
        raise ConfigError(
            f"{source}: {where} {value!r}: the filesystem store is a local directory (file:///dir or a path); "
            "Pulsar's HDFS offloader's URIs are not a store here"
        )
    try:
        return parse_store_url(value).path
    except ConfigError as err:
        raise ConfigError(f"{source}: {where}: {err}") from None


def _settings(cls: type, table: Mapping[str, Any], source: str, section: str) -> Any:
    """The settings of ``section``, its keys given in the file's style (camelCase), as written before (the
    field's own name) or under Pulsar's names (``pulsar_names``); one key under two names is refused."""
    known = {f.name: f for f in fields(cls)}
    names: dict[str, str] = {house_name(name): name for name in known}  # a name in the file -> the field
    names.update({name: name for name in known})
    names.update({alias.name: alias.target for alias in aliases_in(section).values()})
    kwargs: dict[str, Any] = {}
    given: dict[str, str] = {}  # field -> the name it was given under
    for key, value in table.items():
        where = f"{section}.{key}"
        refused = REFUSED.get((section, key))
        if refused is not None:
            raise ConfigError(f"{source}: {where} is not supported: it {refused}")
        if key not in names:
            raise ConfigError(f"{source}: unknown key {where}{_suggest(key, list(names))}")
        name = names[key]
        if name in given:
            raise ConfigError(
                f"{source}: {section}.{given[name]} and {where} are one setting ({section}.{house_name(name)}): "
                "give one of them"
            )
        given[name] = key
        if key == "fileSystemURI":
            value = file_system_root(value, where, source)
        default = getattr(cls(), name)
        if isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: {where} must be a table")
            value = {str(k): _option_text(v, f"{where}.{k}", source) for k, v in value.items()}
        elif isinstance(default, tuple):
            if isinstance(value, str):
                value = tuple(t.strip() for t in value.split(",") if t.strip())
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = tuple(value)
            else:
                raise ConfigError(f"{source}: {where} must be a list of strings")
        elif f"{section}.{name}" in _COUNT_SETTINGS:
            value = _count_setting(value, where, source, _COUNT_SETTINGS[f"{section}.{name}"])
        elif default is None:  # optional settings: a string
            if not isinstance(value, str):
                raise ConfigError(f"{source}: {where} must be a string, got {type(value).__name__} {value!r}")
        else:
            value = _check_type(value, type(default), where, source)
        kwargs[name] = value
    return cls(**kwargs)


def _from_file(path: str | None, base_dir: Path) -> str | None:
    """A path in the file (a SQLite catalog, a warehouse directory), relative to the file; a URI as it is."""
    if path is None or "://" in path or os.path.isabs(path):
        return path
    return str(base_dir / path)


def _table_settings(section: Mapping[str, object], source: str) -> TableSettings:
    """``[table]``: the generic checks, then each key within its bounds (``maintain_every`` also takes "0": never)."""
    table: TableSettings = _settings(TableSettings, section, source, "table")
    if not 1 <= table.segments_per_commit <= MAX_TABLE_SEGMENTS_PER_COMMIT:
        raise ConfigError(
            f"{source}: table.segments_per_commit must be between 1 and {MAX_TABLE_SEGMENTS_PER_COMMIT}, "
            f"got {table.segments_per_commit!r}"
        )
    try:
        interval_ms = parse_duration_ms(table.commit_interval)
    except ValueError as err:
        raise ConfigError(f"{source}: table.commit_interval: {err}") from None
    if not 0 < interval_ms <= MAX_TABLE_COMMIT_INTERVAL_MS:
        raise ConfigError(
            f"{source}: table.commit_interval must be positive and at most a day, got {table.commit_interval!r}"
        )
    try:
        maintain_s = table.maintain_every_s
    except ValueError as err:
        raise ConfigError(f'{source}: table.maintain_every: {err} (or "0": never)') from None
    if maintain_s * 1000 > MAX_TABLE_MAINTAIN_EVERY_MS:
        raise ConfigError(f"{source}: table.maintain_every must be at most 7 days, got {table.maintain_every!r}")
    if table.compact_min_files < 1:
        raise ConfigError(f"{source}: table.compact_min_files must be at least 1, got {table.compact_min_files!r}")
    try:
        target = parse_size(table.compact_target_file_size)
    except ValueError as err:
        raise ConfigError(f"{source}: table.compact_target_file_size: {err}") from None
    if target < 1:
        raise ConfigError(
            f"{source}: table.compact_target_file_size must be at least 1 byte, got {table.compact_target_file_size!r}"
        )
    if table.keep_snapshots < 1:
        raise ConfigError(f"{source}: table.keep_snapshots must be at least 1, got {table.keep_snapshots!r}")
    try:
        max_age_s = table.snapshot_max_age_s
    except ValueError as err:
        raise ConfigError(f'{source}: table.snapshot_max_age: {err} (or "0")') from None
    if max_age_s * 1000 > MAX_TABLE_SNAPSHOT_MAX_AGE_MS:
        raise ConfigError(f"{source}: table.snapshot_max_age must be at most 30 days, got {table.snapshot_max_age!r}")
    return table


def _option_text(value: Any, where: str, source: str) -> str:
    """A value of a table of options passed on as text (``pulsar.client``, ``spark.conf``): a string, a number or
    a boolean (``true``/``false``, as Java and Pulsar write them). A table or an array is refused: in TOML an
    unquoted dotted name (``auth.token = ...``) makes a table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list):
        kind = "a table" if isinstance(value, Mapping) else "an array"
        raise ConfigError(
            f"{source}: {where} is {kind}; its values are strings, numbers or booleans "
            f'(a dotted name is written quoted: "a.b" = ...)'
        )
    return str(value)


def parse_policy_sections(
    doc: Mapping[str, Any], source: str
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The ``[offload]``, ``[namespaces]`` and ``[topics]`` sections of ``doc`` (a configuration file's, or a
    published policy version's, ``streaming.governance.policy_versions``), normalised and each level validated:
    ``ConfigError`` naming ``source`` and the key otherwise."""
    broker_policy = _normalise_policy(_section(doc, "offload", source), source, "offload")
    namespace_policies: dict[str, dict[str, Any]] = {}
    for ns, table in _section(doc, "namespaces", source).items():
        if ns.count("/") != 1 or not all(ns.split("/")):
            raise ConfigError(f"{source}: [namespaces.{ns!r}]: a namespace is written tenant/namespace")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [namespaces.{ns!r}] must be a table")
        namespace_policies[ns] = _normalise_policy(table, source, f"namespaces.{ns!r}")
    topic_policies: dict[str, dict[str, Any]] = {}
    spellings: dict[str, str] = {}
    for topic, table in _section(doc, "topics", source).items():
        try:
            name = str(TopicName.parse(topic))
        except TopicNameError as err:
            raise ConfigError(f"{source}: [topics.{topic!r}]: {err}") from None
        if name in spellings:  # one would silently replace the other (an enabled = false could vanish)
            raise ConfigError(
                f"{source}: [topics.{spellings[name]!r}] and [topics.{topic!r}] are one topic, {name}: "
                "merge them into one section"
            )
        spellings[name] = topic
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [topics.{topic!r}] must be a table")
        topic_policies[name] = _normalise_policy(table, source, f"topics.{topic!r}")

    # Validate every level now, naming the level, so a bad value fails at load and not hours later.
    validated_policy(broker_policy, source, "offload")
    for ns, table in namespace_policies.items():
        validated_policy({**broker_policy, **table}, source, f"namespaces.{ns!r}")
    for topic, table in topic_policies.items():
        validated_policy({**broker_policy, **table}, source, f"topics.{topic!r}")
    return broker_policy, namespace_policies, topic_policies


def parse_config(doc: Mapping[str, Any], source: str = "<config>", base_dir: Path | None = None) -> Config:
    """Build and validate a ``Config`` from a parsed TOML document."""
    known_sections = {"pulsar", "store", "spark", "metrics", "encryption", "table", "offload", "namespaces", "topics"}
    for key in doc:
        if key not in known_sections:
            raise ConfigError(f"{source}: unknown section [{key}]{_suggest(key, sorted(known_sections))}")
    pulsar = _settings(PulsarSettings, _section(doc, "pulsar", source), source, "pulsar")
    store = _settings(StoreSettings, _section(doc, "store", source), source, "store")
    spark = _settings(SparkSettings, _section(doc, "spark", source), source, "spark")
    metrics = _settings(MetricsSettings, _section(doc, "metrics", source), source, "metrics")
    encryption = _settings(EncryptionSettings, _section(doc, "encryption", source), source, "encryption")
    table = _table_settings(_section(doc, "table", source), source)
    if encryption.keys_file and base_dir is not None and not os.path.isabs(encryption.keys_file):
        encryption = replace(encryption, keys_file=str(base_dir / encryption.keys_file))
    if not 0 <= metrics.topic_series <= MAX_TOPIC_SERIES:
        raise ConfigError(
            f"{source}: metrics.topic_series must be between 0 (no per-topic series) and {MAX_TOPIC_SERIES}, "
            f"got {metrics.topic_series!r}"
        )

    driver = store.managedLedgerOffloadDriver
    if driver.lower() not in DRIVERS:
        raise ConfigError(
            f"{source}: store.managedLedgerOffloadDriver must be one of {', '.join(DRIVERS)} (any case, as in "
            f'Pulsar: "S3" is s3), got {driver!r}'
        )
    if driver != driver.lower():
        store = replace(store, managedLedgerOffloadDriver=driver.lower())
    if store.managedLedgerOffloadDriver != "filesystem" and not store.bucket:
        raise ConfigError(f"{source}: store.bucket is required for driver {store.managedLedgerOffloadDriver!r}")
    if pulsar.topics and pulsar.topics_pattern:
        raise ConfigError(f"{source}: give pulsar.topics or pulsar.topics_pattern, not both")
    for topic in pulsar.topics:
        try:
            TopicName.parse(topic)
        except TopicNameError as err:
            raise ConfigError(f"{source}: pulsar.topics: {err}") from None
    # Checked now, not when the job first uses them.
    if pulsar.topics_pattern is not None:
        parse_pattern(pulsar.topics_pattern, f"{source}: pulsar.topics_pattern {pulsar.topics_pattern!r}")
    check_trigger_interval(spark.trigger_interval, f"{source}: spark.trigger_interval")
    if metrics.address.strip():
        parse_metrics_address(metrics.address, f"{source}: metrics.address")
    if base_dir is not None:
        # Relative paths in a file are relative to the file, not to wherever the job was started.
        if store.managedLedgerOffloadDriver == "filesystem" and not os.path.isabs(store.root):
            store = replace(store, root=str(base_dir / store.root))
        if not is_url(spark.checkpoint) and not os.path.isabs(spark.checkpoint):
            spark = replace(spark, checkpoint=str(base_dir / spark.checkpoint))
        if spark.class_archive.strip() and spark.class_archive != CLASS_ARCHIVE_AUTO:
            archive = _from_file(os.path.expanduser(spark.class_archive), base_dir)
            spark = replace(spark, class_archive=archive or "")
        catalog, warehouse = _from_file(table.catalog, base_dir), _from_file(table.warehouse, base_dir)
        table = replace(table, catalog=catalog, warehouse=warehouse)

    broker_policy, namespace_policies, topic_policies = parse_policy_sections(doc, source)
    config = Config(
        pulsar, store, spark, metrics, broker_policy, namespace_policies, topic_policies, source, encryption, table
    )
    # ... and the effective policy of every configured topic, which merges its namespace's (and, for a
    # partition, its partitioned topic's) section: each may be valid alone and not together.
    for topic in (*pulsar.topics, *topic_policies):
        name = TopicName.parse(topic)
        section = f"topics.{str(name)!r}" if str(name) in topic_policies else f"pulsar.topics[{topic!r}]"
        try:
            validated_policy(config._merged_policy(name), source, section)
        except ConfigError as err:
            raise ConfigError(
                f"{err} (in the effective policy of {name}: [offload], its namespace's and its topic's sections merged)"
            ) from None
    check_topics_fit(config)
    if not 0 < pulsar.max_message_size <= MAX_BLOCK_BYTES:
        raise ConfigError(
            f"{source}: pulsar.max_message_size must be between 1 and {MAX_BLOCK_BYTES} bytes, got "
            f"{pulsar.max_message_size!r}"
        )
    check_config_block_sizes(config, pulsar.max_message_size)
    check_encryption_keys(config)
    return config


_PROBE = "streamoffload-block-size-check"
"""A topic name in each configured namespace, for its policy."""


def check_config_block_sizes(config: Config, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
    """The block-size rule (``checkpoints.policy.check_block_size``) for every policy the configuration can
    apply: the configured topics', each namespace's and each topic's policy (and the broker defaults through
    them)."""
    names: list[str] = [*config.pulsar.topics, *config.topic_policies]
    names += [f"persistent://{namespace}/{_PROBE}" for namespace in config.namespace_policies]
    if not names:
        names = [f"persistent://public/default/{_PROBE}"]
    for name in names:
        policy = config.policy_for(name)
        where = f"{config.source}: managedLedgerOffloadMaxBlockSizeInBytes"
        if not name.endswith(_PROBE):
            where += f" (policy of {name})"
        check_block_size(policy.managedLedgerOffloadMaxBlockSizeInBytes, max_message_size, where=where)


def check_encryption_keys(config: Config) -> None:
    """Refuse at load a policy level naming an encryption key id that no configured key answers (the job
    would otherwise fail at its first segment). Key material is never shown."""
    levels = [("[offload]", config.broker_policy)]
    levels += [(f"[namespaces.{ns!r}]", t) for ns, t in config.namespace_policies.items()]
    levels += [(f"[topics.{t!r}]", table) for t, table in config.topic_policies.items()]
    wanted = [(where, str(table.get("offloadEncryptionKeyId") or "")) for where, table in levels]
    wanted = [(where, key_id) for where, key_id in wanted if key_id]
    if not wanted:
        return
    keyring = config.encryption.keyring()
    for where, key_id in wanted:
        if key_id not in keyring.keys:
            raise ConfigError(
                f"{config.source}: {where} offloadEncryptionKeyId = {key_id!r}: no such key in "
                f"{config.encryption.keys_file or 'encryption.keys_file (not set)'} or the environment "
                f"(STREAMOFFLOAD_KEK_{key_id})"
            )


def check_topics_fit(config: Config) -> None:
    """Refuse a configured topic (``pulsar.topics`` and ``[topics."..."]``) whose objects the store cannot
    hold: non-persistent, a directory name over 255 bytes, or a key over 1024 bytes with the store prefix
    (``storage.keys.check_topic_fits``). Called at load, and again after command-line overrides, so such a
    topic fails at start and not in the sink. Topics found later by ``topics_pattern`` are the job's to
    check, one by one, with ``check_topic_fits``."""
    from streamoffload.storage.base import InvalidKeyError
    from streamoffload.storage.keys import check_prefix, check_topic_fits

    source = config.source
    prefix = config.store.location.prefix
    try:
        check_prefix(prefix)
    except InvalidKeyError as err:
        raise ConfigError(f"{source}: store.prefix {config.store.prefix!r} cannot start an object key: {err}") from None
    configured = [("pulsar.topics", t) for t in config.pulsar.topics]
    configured += [(f"[topics.{t!r}]", t) for t in config.topic_policies]
    for where, topic in configured:
        try:
            check_topic_fits(prefix, topic)
        except (TopicNameError, InvalidKeyError) as err:
            raise ConfigError(f"{source}: {where}: cannot offload {topic!r}: {err}") from None


def load_config(path: str | os.PathLike[str]) -> Config:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {file}") from None
    except OSError as err:
        raise ConfigError(f"cannot read configuration file {file}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{file}: not UTF-8 text (byte {err.start}): {err.reason}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{file}: not valid TOML: {err}") from None
    return parse_config(doc, str(file), file.resolve().parent)


class PolicySource:
    """The policy part of a configuration file, re-read when the file changes (checked at most every
    ``min_interval_s``). A file that became invalid keeps the last good policy and reports the error
    once, so a typo in a running job's file does not stop offloading."""

    def __init__(self, config: Config, path: str | None, min_interval_s: float = 1.0) -> None:
        self._config = config
        self._path = path
        self._min_interval_s = min_interval_s
        self._stamp: tuple[int, int] | None = self._stat()
        self._checked = 0.0
        self.last_error: str | None = None

    def _stat(self) -> tuple[int, int] | None:
        if not self._path:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self, now: float | None = None) -> Config:
        import time

        now = time.monotonic() if now is None else now
        if self._path and now - self._checked >= self._min_interval_s:
            self._checked = now
            stamp = self._stat()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._config = self._config.with_policy_source(load_config(self._path))
                    self.last_error = None
                except (StreamOffloadError, ValueError, TypeError, OverflowError) as err:
                    # ConfigError in practice; anything else a bad edit could raise keeps the last good policy too.
                    self.last_error = str(err) if isinstance(err, ConfigError) else f"{self._path}: {err}"
        return self._config

    def policy_for(self, topic: TopicName | str) -> OffloadPolicy:
        return self.current().policy_for(topic)

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to Spark executors: they re-stat the file themselves.
        return self.__dict__.copy()
