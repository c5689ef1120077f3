"""Configuration: one TOML file with the Pulsar connection, the topics, the store, Spark settings and
the offload policy at broker, namespace and topic level (the most specific level wins).

Policy keys use Pulsar's own names where they exist. Every problem is reported as a ``ConfigError``
naming the key and the file. The running job re-reads the file when it changes (``PolicySource``), so
policy changes need no restart; connection, store and Spark settings are read once at start.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from streamoffload.codecs.errors import ConfigError
from streamoffload.codecs.topics import TopicName, TopicNameError

MIB = 1024 * 1024
HEADER_AND_ONE_ENTRY = 128 + 12 + 1

METHODS = ("streaming", "ledger")
DRIVERS = ("filesystem", "aws-s3", "s3")


@dataclass(frozen=True)
class OffloadPolicy:
    """The effective offload policy of one topic-partition (after broker/namespace/topic merging)."""

    enabled: bool = True
    method: str = "streaming"
    maxSizePerOffloadSegmentMbytes: float = 1024.0
    maxOffloadSegmentRolloverTimeMinutes: float = 10.0
    managedLedgerOffloadMaxBlockSizeInBytes: int = 64 * MIB
    managedLedgerOffloadReadBufferSizeInBytes: int = 1 * MIB
    offloadBufferMaxBytes: int = 128 * MIB
    """Bound of the PIP-76 offload buffer: bytes accepted but not yet uploaded, per topic-partition."""
    retentionTimeInMinutes: float = -1.0
    """Offloaded ledgers older than this are marked deleted; -1 keeps them forever."""
    retentionSizeInMB: float = -1.0
    """Oldest ledgers are marked deleted while the offloaded total exceeds this; -1: no limit."""
    managedLedgerOffloadDeletionLagMs: int = 4 * 60 * 60 * 1000
    """How long a segment whose ledgers are all marked deleted stays readable before its objects go."""

    @property
    def max_segment_bytes(self) -> int:
        return int(self.maxSizePerOffloadSegmentMbytes * MIB)

    @property
    def rollover_ms(self) -> int:
        return int(self.maxOffloadSegmentRolloverTimeMinutes * 60_000)

    @property
    def block_size(self) -> int:
        return self.managedLedgerOffloadMaxBlockSizeInBytes

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_POLICY_TYPES: dict[str, type] = typing.get_type_hints(OffloadPolicy)
_POLICY_ALIASES = {
    # Seconds are allowed where Pulsar only has minutes: tests and demos want short rollovers.
    "maxOffloadSegmentRolloverTimeSeconds": ("maxOffloadSegmentRolloverTimeMinutes", 1 / 60),
    "managedLedgerOffloadDriverBufferBytes": ("offloadBufferMaxBytes", 1),
}


@dataclass(frozen=True)
class PulsarSettings:
    service_url: str = "pulsar://127.0.0.1:6650"
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    starting_offsets: str = "earliest"
    max_entries_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
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

    @property
    def url(self) -> str:
        if self.managedLedgerOffloadDriver == "filesystem":
            return Path(self.root).resolve().as_uri()
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def open(self) -> Any:
        """Open the configured ``ObjectStore``."""
        from streamoffload.storage.urls import open_store

        if self.managedLedgerOffloadDriver == "filesystem":
            return open_store(self.url)
        return open_store(
            f"s3://{self.bucket}",
            endpoint_url=self.serviceEndpoint,
            region=self.region,
            path_style=self.pathStyle,
        )

    @property
    def key_prefix(self) -> str:
        """The prefix inside the store that object keys start with (S3 keys live under it)."""
        return "" if self.managedLedgerOffloadDriver == "filesystem" else self.prefix.strip("/")


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[2]"
    checkpoint: str = "var/checkpoint"
    trigger_interval: str = "5 seconds"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsSettings:
    address: str = "127.0.0.1:9464"
    """host:port of the Prometheus endpoint; empty disables it."""


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

    def policy_for(self, topic: TopicName | str) -> OffloadPolicy:
        """Broker defaults, then the namespace's, then the partitioned topic's, then the partition's."""
        name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        merged: dict[str, Any] = dict(self.broker_policy)
        merged.update(self.namespace_policies.get(name.namespace_name, {}))
        merged.update(self.topic_policies.get(str(name.base), {}))
        if name.is_partition:
            merged.update(self.topic_policies.get(str(name), {}))
        return _validated_policy(merged, self.source, f"policy of {name}")

    def with_policy_source(self, other: Config) -> Config:
        """This configuration with the policy sections of ``other`` (a re-read file)."""
        return replace(
            self,
            broker_policy=other.broker_policy,
            namespace_policies=other.namespace_policies,
            topic_policies=other.topic_policies,
        )


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_type(value: Any, expected: type, key: str, source: str) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise ConfigError(f"{source}: {key} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def _normalise_policy(table: Mapping[str, Any], source: str, section: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{section}.{key}"
        if key in _POLICY_ALIASES:
            target, factor = _POLICY_ALIASES[key]
            value = _check_type(value, float, where, source) * factor
            key = target
        if key not in _POLICY_TYPES:
            raise ConfigError(f"{source}: unknown offload policy key {where}{_suggest(key, list(_POLICY_TYPES))}")
        out[key] = _check_type(value, _POLICY_TYPES[key], where, source)
    return out


def _validated_policy(values: Mapping[str, Any], source: str, section: str) -> OffloadPolicy:
    policy = OffloadPolicy(**values)
    checks = [
        (policy.method in METHODS, "method", f"must be one of {', '.join(METHODS)}, got {policy.method!r}"),
        (
            policy.block_size >= HEADER_AND_ONE_ENTRY,
            "managedLedgerOffloadMaxBlockSizeInBytes",
            f"must be at least {HEADER_AND_ONE_ENTRY} (a 128-byte header and one framed entry)",
        ),
        (policy.maxSizePerOffloadSegmentMbytes > 0, "maxSizePerOffloadSegmentMbytes", "must be positive"),
        (policy.maxOffloadSegmentRolloverTimeMinutes > 0, "maxOffloadSegmentRolloverTimeMinutes", "must be positive"),
        (
            policy.offloadBufferMaxBytes >= policy.block_size,
            "offloadBufferMaxBytes",
            f"({policy.offloadBufferMaxBytes}) must hold at least one block ({policy.block_size})",
        ),
        (
            policy.managedLedgerOffloadReadBufferSizeInBytes > 0,
            "managedLedgerOffloadReadBufferSizeInBytes",
            "must be positive",
        ),
        (policy.managedLedgerOffloadDeletionLagMs >= 0, "managedLedgerOffloadDeletionLagMs", "must be >= 0"),
    ]
    for ok, key, problem in checks:
        if not ok:
            raise ConfigError(f"{source}: {section}.{key} {problem}")
    return policy


def _section(doc: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: [{name}] must be a table, got {type(value).__name__}")
    return value


def _settings(cls: type, table: Mapping[str, Any], source: str, section: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{section}.{key}"
        if key not in known:
            raise ConfigError(f"{source}: unknown key {where}{_suggest(key, list(known))}")
        default = getattr(cls(), key)
        if isinstance(default, Mapping):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: {where} must be a table")
            value = {str(k): str(v) for k, v in value.items()}
        elif isinstance(default, tuple):
            if isinstance(value, str):
                value = tuple(t.strip() for t in value.split(",") if t.strip())
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = tuple(value)
            else:
                raise ConfigError(f"{source}: {where} must be a list of strings")
        elif default is None:  # optional settings: a string or a number
            if value is not None and not isinstance(value, str | int):
                raise ConfigError(f"{source}: {where} has the wrong type {type(value).__name__}")
        else:
            value = _check_type(value, type(default), where, source)
        kwargs[key] = value
    return cls(**kwargs)


def parse_config(doc: Mapping[str, Any], source: str = "<config>", base_dir: Path | None = None) -> Config:
    """Build and validate a ``Config`` from a parsed TOML document."""
    known_sections = {"pulsar", "store", "spark", "metrics", "offload", "namespaces", "topics"}
    for key in doc:
        if key not in known_sections:
            raise ConfigError(f"{source}: unknown section [{key}]{_suggest(key, sorted(known_sections))}")
    pulsar = _settings(PulsarSettings, _section(doc, "pulsar", source), source, "pulsar")
    store = _settings(StoreSettings, _section(doc, "store", source), source, "store")
    spark = _settings(SparkSettings, _section(doc, "spark", source), source, "spark")
    metrics = _settings(MetricsSettings, _section(doc, "metrics", source), source, "metrics")

    if store.managedLedgerOffloadDriver not in DRIVERS:
        raise ConfigError(
            f"{source}: store.managedLedgerOffloadDriver must be one of {', '.join(DRIVERS)}, "
            f"got {store.managedLedgerOffloadDriver!r}"
        )
    if store.managedLedgerOffloadDriver != "filesystem" and not store.bucket:
        raise ConfigError(f"{source}: store.bucket is required for driver {store.managedLedgerOffloadDriver!r}")
    if pulsar.topics and pulsar.topics_pattern:
        raise ConfigError(f"{source}: give pulsar.topics or pulsar.topics_pattern, not both")
    for topic in pulsar.topics:
        try:
            TopicName.parse(topic)
        except TopicNameError as err:
            raise ConfigError(f"{source}: pulsar.topics: {err}") from None
    if base_dir is not None:
        # Relative paths in a file are relative to the file, not to wherever the job was started.
        if store.managedLedgerOffloadDriver == "filesystem" and not os.path.isabs(store.root):
            store = replace(store, root=str(base_dir / store.root))
        if "://" not in spark.checkpoint and not os.path.isabs(spark.checkpoint):
            spark = replace(spark, checkpoint=str(base_dir / spark.checkpoint))

    broker_policy = _normalise_policy(_section(doc, "offload", source), source, "offload")
    namespace_policies: dict[str, dict[str, Any]] = {}
    for ns, table in _section(doc, "namespaces", source).items():
        if ns.count("/") != 1 or not all(ns.split("/")):
            raise ConfigError(f"{source}: [namespaces.{ns!r}]: a namespace is written tenant/namespace")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [namespaces.{ns!r}] must be a table")
        namespace_policies[ns] = _normalise_policy(table, source, f"namespaces.{ns!r}")
    topic_policies: dict[str, dict[str, Any]] = {}
    for topic, table in _section(doc, "topics", source).items():
        try:
            name = str(TopicName.parse(topic))
        except TopicNameError as err:
            raise ConfigError(f"{source}: [topics.{topic!r}]: {err}") from None
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [topics.{topic!r}] must be a table")
        topic_policies[name] = _normalise_policy(table, source, f"topics.{topic!r}")

    # Validate every level now, naming the level, so a bad value fails at load and not hours later.
    _validated_policy(broker_policy, source, "offload")
    for ns, table in namespace_policies.items():
        _validated_policy({**broker_policy, **table}, source, f"namespaces.{ns!r}")
    for topic, table in topic_policies.items():
        _validated_policy({**broker_policy, **table}, source, f"topics.{topic!r}")
    return Config(pulsar, store, spark, metrics, broker_policy, namespace_policies, topic_policies, source)


def load_config(path: str | os.PathLike[str]) -> Config:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {file}") from None
    except OSError as err:
        raise ConfigError(f"cannot read configuration file {file}: {err.strerror}") from None
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
                except ConfigError as err:
                    self.last_error = str(err)
        return self._config

    def policy_for(self, topic: TopicName | str) -> OffloadPolicy:
        return self.current().policy_for(topic)

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to Spark executors: they re-stat the file themselves.
        return self.__dict__.copy()
