"""Offload policy versions: what governs each micro-batch, decided so that a replay decides the same.

The job's driver publishes the policy part of its configuration (the ``[offload]``, ``[namespaces]`` and
``[topics]`` sections) as an immutable **version** in the store,
``<prefix>/_meta/policies/<effectiveMs:020d>``, at every run start and whenever the file changes. A
micro-batch uses the newest version whose effective time is at or before the batch's timestamp, which
Spark records in its offset log: a replayed batch therefore sees the same policy, whatever the file says
by then, and executors need no copy of the file (on a cluster they have none).

Why the effective time lies ``publish_delay_ms`` after the publication: executors re-list the versions at
most every ``refresh_s`` seconds, so a version must exist for longer than that (plus clock skew) before a
batch can need it. Edits therefore take effect within about ``refresh_s + 5`` seconds.

A segment's own policy is fixed when it opens (recorded in its manifest); a version only decides what
new segments use, and whether a topic is enabled and by which method, which seal an open segment at once.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.topics import TopicName
from streamoffload.config import Config, parse_policy_sections
from streamoffload.errors import ConfigError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectNotFoundError, ObjectStore
from streamoffload.storage.location import StoreLocation
from streamoffload.streaming.runtime.side_files import WatchedJsonFile, write_json_file

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 10.0
CLOCK_SKEW_MS = 5_000
KEEP_VERSIONS = 20


def policy_document(config: Config) -> dict[str, Any]:
    """The policy sections of a configuration, as JSON (keys already canonical and validated)."""
    return {
        "offload": dict(config.broker_policy),
        "namespaces": {k: dict(v) for k, v in sorted(config.namespace_policies.items())},
        "topics": {k: dict(v) for k, v in sorted(config.topic_policies.items())},
    }


def config_of(doc: Mapping[str, Any], source: str) -> Config:
    """The policy document as a configuration's policy sections, validated as a configuration file's are:
    ``ConfigError`` naming ``source`` and the key for anything else (a version is read from the store, and
    trusted no more than a file)."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: not a policy version: a JSON object, not {type(doc).__name__}")
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{source}: not a policy version: unknown section {unknown[0]!r} (known: {', '.join(SECTIONS)})"
        )
    broker, namespaces, topics = parse_policy_sections(doc, source)
    config = Config(broker_policy=broker, namespace_policies=namespaces, topic_policies=topics, source=source)
    for topic in topics:  # each level is valid alone; a topic's merges its namespace's too
        config.policy_for(topic)
    return config


SECTIONS = ("offload", "namespaces", "topics")


def decode_version(data: bytes, where: str) -> dict[str, Any]:
    """The policy document stored at ``where``, checked (``config_of``); ``ConfigError`` naming ``where``."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{where}: not a policy version (not JSON: {err})") from None
    config_of(doc, where)
    return dict(doc)


def publish_delay_ms(refresh_s: float, clock_skew_ms: int = CLOCK_SKEW_MS) -> int:
    return int(refresh_s * 1000) + clock_skew_ms


class PolicyVersions:
    """A sorted list of ``(effective_ms, policy document)``; resolves a topic's policy at a time."""

    def __init__(self, versions: Sequence[tuple[int, Mapping[str, Any]]] = ()) -> None:
        self._effective: list[int] = []
        self._configs: list[Config] = []
        self._cache: dict[tuple[int, str], OffloadPolicy] = {}
        for effective, doc in sorted(versions, key=lambda v: v[0]):
            self.add(effective, doc)

    def add(self, effective_ms: int, doc: Mapping[str, Any]) -> None:
        i = bisect.bisect_left(self._effective, effective_ms)
        if i < len(self._effective) and self._effective[i] == effective_ms:
            return
        self._effective.insert(i, effective_ms)
        self._configs.insert(i, config_of(doc, f"policy version {effective_ms}"))
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._effective)

    @property
    def latest_effective(self) -> int | None:
        return self._effective[-1] if self._effective else None

    def policy_at(self, topic: str, at_ms: int) -> OffloadPolicy:
        i = bisect.bisect_right(self._effective, at_ms) - 1
        if i < 0:
            if not self._effective:
                raise ConfigError("no offload policy has been published for this run")
            i = 0  # a batch before the first version of this run cannot happen; use the earliest
        key = (self._effective[i], topic)
        policy = self._cache.get(key)
        if policy is None:
            policy = self._cache[key] = self._configs[i].policy_for(TopicName.parse(topic))
        return policy


class PolicyLog:
    """The versions in a store, for the driver (publish) and executors (resolve by batch time)."""

    def __init__(
        self,
        location: StoreLocation,
        refresh_s: float = DEFAULT_REFRESH_S,
        clock_skew_ms: int = CLOCK_SKEW_MS,
    ) -> None:
        self.location = location
        self.prefix = location.prefix
        self.refresh_s = refresh_s
        self.clock_skew_ms = clock_skew_ms
        self._store: ObjectStore | None = None
        self._versions = PolicyVersions()
        self._listed_at: float | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to executors: they open their own store and list the versions themselves.
        return {k: getattr(self, k) for k in ("location", "refresh_s", "clock_skew_ms")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = self.location.open().store
        return self._store

    def _dir(self) -> str:
        return keys.prefix_meta_prefix(self.prefix, keys.POLICIES)

    def _list(self) -> list[tuple[int, str]]:
        out = []
        for info in self.store.list(self._dir()):
            name = info.key.rsplit("/", 1)[-1]
            if name.isdigit():
                out.append((int(name), info.key))
        return sorted(out)

    # -- executors ---------------------------------------------------------------------------------

    def policy_at(self, topic: str, at_ms: int) -> OffloadPolicy:
        with self._lock:
            now = time.time()
            if self._listed_at is None or now - self._listed_at > self.refresh_s:
                self._refresh()
                self._listed_at = now
            return self._versions.policy_at(topic, at_ms)

    def _refresh(self) -> None:
        for effective, key in self._list():
            if self._versions.latest_effective is not None and effective <= self._versions.latest_effective:
                continue
            try:
                self._versions.add(effective, decode_version(self.store.get(key), key))
            except ObjectNotFoundError:
                continue

    # -- the driver ----------------------------------------------------------------------------------

    def versions(self) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for effective, key in self._list():
            try:
                out.append((effective, decode_version(self.store.get(key), key)))
            except ObjectNotFoundError:
                continue
        return out

    def start_run(self, config: Config, now_ms: int) -> list[tuple[int, dict[str, Any]]]:
        """At a run start (lease held): drop versions a dead run scheduled for later, publish the current
        policy effective now, keep a short history. Returns the versions in force."""
        doc = policy_document(config)
        listed = self._list()
        for effective, key in listed:
            if effective > now_ms:
                self.store.delete(key)
        kept = [(e, k) for e, k in listed if e <= now_ms]
        latest = decode_version(self.store.get(kept[-1][1]), kept[-1][1]) if kept else None
        if latest != doc:
            self._put(now_ms, doc)
            kept.append((now_ms, self._key(now_ms)))
        for _effective, key in kept[:-KEEP_VERSIONS]:
            self.store.delete(key)
        return self.versions()

    def publish(self, config: Config, now_ms: int) -> int:
        """A changed policy, effective once every executor can have seen it. Returns the effective time."""
        effective = now_ms + publish_delay_ms(self.refresh_s, self.clock_skew_ms)
        self._put(effective, policy_document(config))
        return effective

    def _key(self, effective_ms: int) -> str:
        return self._dir() + f"{effective_ms:020d}"

    def _put(self, effective_ms: int, doc: Mapping[str, Any]) -> None:
        self.store.put(self._key(effective_ms), json.dumps(doc, sort_keys=True).encode())


# -- the source's view (a file on the driver's machine) --------------------------------------------------


def write_versions_file(path: str, versions: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
    """The versions for the Pulsar source (which pauses disabled topics), written atomically."""
    write_json_file(path, [[e, d] for e, d in versions], temp_prefix=".policies-")


class VersionsFile:
    """Reads ``write_versions_file``'s file again when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = WatchedJsonFile(
            path, lambda doc: PolicyVersions([(int(e), d) for e, d in doc]), PolicyVersions(), "policy versions"
        )

    def current(self) -> PolicyVersions:
        return self._file.current()

    def enabled(self, topic: str, at_ms: int) -> bool:
        versions = self.current()
        return True if not len(versions) else versions.policy_at(topic, at_ms).enabled
