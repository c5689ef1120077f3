"""Everything the Pulsar source decides on the driver, in plain Python: :class:`SourcePlanner` discovers the
topic-partitions, looks up positions, pauses disabled or quarantined topic-partitions, applies admission
control (``streaming.source.admission``) and keeps the backlog (``streaming.source.backlog``). The Spark classes in
``streaming/source/pulsar_source.py`` only call it; tests drive it directly.

Offsets are JSON objects ``{topic-partition: [ledgerId, entryId]}``: the last position emitted, or
``[-1, -1]`` before the first entry; keys sorted, as Spark compares offsets as JSON text."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.positions import Position
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.broker_connection import TopicListingUnsupported, list_topics
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    DataLossError,
    Probe,
    PulsarIOError,
    TopicNotFoundError,
    gap,
)
from streamoffload.pulsar.latest_positions import HeldPositions, latest_positions_raw
from streamoffload.read.starting_time import broker_position_at, stored_position_at
from streamoffload.read.through import BrokerFront, TierView
from streamoffload.read.topic_reader import TopicReader
from streamoffload.redaction import redact
from streamoffload.storage import keys
from streamoffload.streaming.governance.policy_versions import VersionsFile
from streamoffload.streaming.governance.quarantine import PauseFile, TopicFailedError
from streamoffload.streaming.source.admission import BufferFile, buffer_bound, fair_shares
from streamoffload.streaming.source.backlog import PartitionBacklog, entries_between, write_backlog_file
from streamoffload.streaming.source.input_partitions import Range
from streamoffload.streaming.source.source_options import SourceOptions, parse_pattern

log = logging.getLogger(__name__)

STORED_PIECE_BYTES = 32 << 20
"""Read-through: the stored bytes one task reads at least before a range is cut (as ``pulsar-offloaded``'s
``maxPartitionBytes``): a task costs a few hundred ms, so smaller pieces would cost more than they save."""


def offsets_json(positions: Mapping[str, Position]) -> dict[str, list[int]]:
    """Canonical offset JSON: sorted keys (Spark compares offsets as JSON text)."""
    return {tp: [int(positions[tp][0]), int(positions[tp][1])] for tp in sorted(positions)}


def _went_back(latest: Position | None, consumed: Position) -> bool:
    """The broker's latest position is before what was consumed: entries lost (or a broker answering early)."""
    return (latest is None and consumed > BEFORE_EARLIEST) or (latest is not None and latest < consumed)


def position_of(value: Any) -> Position:
    """A position from offset JSON (``[ledgerId, entryId]``, two integers); ``ValueError`` otherwise."""
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    ):
        raise ValueError(f"expected a position [ledgerId, entryId], got {value!r}")
    return (int(value[0]), int(value[1]))


def offset_positions(offset: str | Mapping[str, Any]) -> dict[str, Position]:
    """The positions of a Pulsar source offset (its JSON text, or the object) by topic-partition. Keys that are no
    topic-partition's (no ``://``: :data:`SEALED_KEY`, :data:`WAKE_KEY`) are left out; ``ValueError`` for text
    that is not a JSON object, or a topic-partition's value that is not a position."""
    try:
        doc = json.loads(offset) if isinstance(offset, str) else offset
    except ValueError:
        doc = None
    if not isinstance(doc, Mapping):
        raise ValueError(f"expected an offset {{topic-partition: [ledgerId, entryId]}}, got {offset!r}")
    return {tp: position_of(value) for tp, value in doc.items() if isinstance(tp, str) and "://" in tp}


SEALED_KEY = "sealedAtEnd"
"""In a ``sealAtEnd`` query's offset: the seal markers were emitted. Not a topic-partition name (no ``://``),
so offset readers that want positions skip it (:func:`offset_positions`)."""


WAKE_KEY = "wakeAt"
"""In the offload job's offset: when (epoch ms) the source last planned a micro-batch with no new entries, so
that the segmenter's processing-time timers fire (a rollover deadline of a quiet topic-partition). The job turns
Spark's no-data micro-batches off: with processing-time timers Spark would otherwise run one at every trigger,
whatever the timers say (SPARK-50180), and each costs the JVM most of a CPU second. Not a topic-partition."""

WAKE_FALLBACK_S = 30.0
"""A micro-batch at least this often while nothing moves, whatever the job reported: timers the job cannot
report yet (state restored from a checkpoint, before the run's first micro-batch) fire at most this late."""


def split_offsets(doc: Mapping[str, Any]) -> tuple[dict[str, Position], bool]:
    """An offset's positions by topic-partition, and whether it marks the seal markers as emitted."""
    return offset_positions(doc), bool(doc.get(SEALED_KEY))


def even_share(available: int | None, allowed: int | None) -> int | None:
    """What a micro-batch of ``Trigger.AvailableNow`` takes of a topic-partition's ``available`` entries when it
    may take ``allowed``: the remainder split evenly over the micro-batches it needs anyway (``ceil(available /
    allowed)``), never more micro-batches. With the sink writing one micro-batch while the next is read
    (``streaming.sink.pipeline``), a run's time is its reads plus its last write: 600 MB at 128 MiB a
    topic-partition went as 88% then 12%, the 88% written while 12% was read; halves overlap twice as much."""
    if available is None or allowed is None or allowed <= 0 or allowed >= available:
        return allowed
    micro_batches = -(-available // allowed)
    return -(-available // micro_batches)


class SourcePlanner:
    """Everything the source decides on the driver, in plain Python (tests drive it directly)."""

    def __init__(self, options: SourceOptions, client_factory: Callable[[], Any] | None = None) -> None:
        self.options = options
        self._client_factory = client_factory or (
            lambda: client_reader.shared_client(options.service_url, options.client_opts)
        )
        self._client: Any = None
        self._raw: rr.RawClient | None = None
        self._held: HeldPositions | None = None
        """Consumers held between triggers to ask the latest positions on (one question per topic-partition)."""
        self._partitions: list[str] = []
        self._discovered_at = float("-inf")
        self._listing_supported: bool | None = None
        self._target: dict[str, Position | None] | None = None
        self._latest: dict[str, Position | None] = {}
        self._consumed: dict[str, Position] = {}
        self._entry_size: dict[str, float] = {}
        self._known_ends: dict[str, Position] = {}
        self._round = 0
        self._next_lookup: dict[str, float] = {}
        """Quiet topic-partitions: when (monotonic) their latest position is asked for again (``idlePollSeconds``)."""
        self._absent: set[str] = set()
        """Topic-partitions the broker said do not exist at their last lookup (deleted, or not created yet)."""
        self._let_go: set[str] = set()
        """Topic-partitions read before and now absent: kept at their position, said once (``_let_go_of``)."""
        self._policies = VersionsFile(options.policy_versions_file) if options.policy_versions_file else None
        self._buffers = BufferFile(options.buffer_file) if options.buffer_file else None
        self._quarantine = PauseFile(options.quarantine_file) if options.quarantine_file else None
        self._fit: dict[str, bool] = {}
        """Whether a topic-partition's keys fit the store (``_fits``), once per topic-partition."""
        self._read_any = False
        """Whether this query planned a micro-batch with entries (``sealAtEnd`` seals only then)."""
        self._planned_at = time.monotonic()
        """When this planner last planned a micro-batch (entries or a wake), for ``WAKE_FALLBACK_S``."""
        self._tier = TierView(options.offloaded, options.discovery_interval_s) if options.offloaded else None
        """``offloaded.store``: the store that holds what the broker no longer does (read-through)."""
        self._fronts: dict[str, tuple[float, BrokerFront]] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The ``pulsar-client`` client: topic discovery, and positions with ``reader=client``."""
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    @property
    def raw_client(self) -> rr.RawClient:
        """One raw-protocol client for the planner's lifetime (configuration only: each position
        lookup or probe opens and closes its own connection)."""
        if self._raw is None:
            self._raw = rr.RawClient(self.options.service_url, self.options.client_opts)
        return self._raw

    def _latest_position(self, tp: str) -> Position | None:
        if self.options.reader == "raw":
            return rr.latest_position_raw(self.raw_client, tp)
        return client_reader.latest_position(self.client, tp)

    # --- discovery --------------------------------------------------------------------------

    def topic_partitions(self, force: bool = False) -> list[str]:
        """The topic-partitions to read now (re-discovered every ``discoveryIntervalSeconds``)."""
        now = time.monotonic()
        if not force and now - self._discovered_at < self.options.discovery_interval_s:
            return self._partitions
        found: set[str] = set()
        if self.options.topics:
            for topic in self.options.topics:
                found.update(self._expand(topic))
        else:
            assert self.options.topics_pattern is not None
            namespace, regex = parse_pattern(self.options.topics_pattern)
            names = self._list_namespace(namespace)
            for name in names:
                parsed = TopicName.parse(name)
                if parsed.namespace_name != namespace or parsed.domain != "persistent":
                    continue
                matches = regex.fullmatch(parsed.local_name) or regex.fullmatch(parsed.base.local_name)
                if matches and self._fits(parsed):
                    found.add(str(parsed))
        if self._partitions and set(self._partitions) != found:
            log.info("pulsar source: topic-partitions now %s (were %s)", sorted(found), self._partitions)
            self._forget([tp for tp in self._partitions if tp not in found])
        self._partitions = sorted(found)
        self._discovered_at = now
        return self._partitions

    def _forget(self, gone: Sequence[str]) -> None:
        """What the planner remembers of topic-partitions no longer discovered (deleted, or no longer matching),
        so that a namespace whose topics come and go does not grow it, nor the backlog and progress reports.
        Their positions stay in the offset: one discovered again is read on from there."""
        for tp in gone:
            for memory in (self._latest, self._consumed, self._next_lookup, self._entry_size, self._fit):
                memory.pop(tp, None)

    def _fits(self, topic: TopicName) -> bool:
        """Configured topics are checked at config load; one a pattern finds later is checked here, and
        skipped (with one warning) rather than failing in the sink."""
        if self.options.key_prefix is None:
            return True
        name = str(topic)
        if name in self._fit:  # the verdict stays: the key prefix is the query's (~0.1 ms a topic to compute)
            return self._fit[name]
        try:
            keys.check_topic_fits(self.options.key_prefix, topic)
            self._fit[name] = True
        except TopicNameError as err:
            self._fit[name] = False
            log.warning("pulsar source: %s matches topicsPattern but is not offloaded: %s", topic, err)
        return self._fit[name]

    def _expand(self, topic: str) -> list[str]:
        with contextlib.suppress(TopicNameError):
            name = TopicName.parse(topic)
            if name.is_partition:  # its own answer (client_reader.topic_partitions): no pulsar-client started for it
                return [str(name)]
        return [str(TopicName.parse(p)) for p in client_reader.topic_partitions(self.client, topic)]

    def _list_namespace(self, namespace: str) -> list[str]:
        if self._listing_supported is not False:
            try:
                listed = list_topics(self.options.service_url, namespace, client_options=self.options.client_opts)
                self._listing_supported = True
                return listed
            except TopicListingUnsupported as err:
                self._listing_supported = False
                log.warning("pulsar source: %s; using topicsPatternCandidates", err)
        if not self.options.pattern_candidates:
            raise PulsarIOError(
                f"topicsPattern {self.options.topics_pattern!r}: the broker at {redact(self.options.service_url)} "
                "cannot list the topics of a namespace (no GetTopicsOfNamespace); name the candidate topics with "
                "topicsPatternCandidates or use the topics option"
            )
        names: list[str] = []
        for candidate in self.options.pattern_candidates:
            names.extend(self._expand(candidate))
        return names

    # --- positions ----------------------------------------------------------------------------

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """Driver-side lookups ride out a broker restart: backoff until retryTimeoutSeconds."""
        deadline = time.monotonic() + self.options.retry_timeout_s
        delay = 0.1
        while True:
            try:
                return call()
            except TopicNotFoundError:
                raise  # an answer, not a failure: the topic does not exist
            except PulsarIOError as err:
                if time.monotonic() + delay > deadline:
                    raise PulsarIOError(
                        f"{what}: still failing after {self.options.retry_timeout_s:g} s of retries: {err}"
                    ) from err
                log.warning("pulsar source: %s failed (%s); retrying in %.1f s", what, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def latest_positions(self, partitions: Sequence[str]) -> dict[str, Position | None]:
        """Each topic-partition's latest position on the broker. With the raw reader all of them in a few
        pipelined round trips (``pulsar.latest_positions``); what that could not answer, and everything
        with the ``pulsar-client`` reader, one at a time with retries."""
        batch: dict[str, Any] = {}
        if self.options.reader == "raw" and partitions and (len(partitions) > 1 or self._held is not None):
            batch = self._retrying("latest positions", lambda: self._latest_batch(partitions))
        latest: dict[str, Position | None] = {}
        for tp in partitions:
            got = batch.get(tp)
            if tp not in batch or (isinstance(got, PulsarIOError) and not isinstance(got, TopicNotFoundError)):
                try:
                    got = self._retrying(f"latest position of {tp}", partial(self._latest_position, tp))
                except TopicNotFoundError as err:
                    got = err
            if isinstance(got, TopicNotFoundError):  # nothing to read: deleted, or not created yet
                self._absent.add(tp)
                got = None
            else:
                self._absent.discard(tp)
                self._let_go.discard(tp)
            latest[tp] = got
        if self._tier is not None:
            # Read-through: a topic-partition ends at the later of the broker's latest and the store's last.
            for tp in partitions:
                stored = self._tier.history(tp).last()
                if stored is not None and (latest[tp] is None or stored > latest[tp]):  # type: ignore[operator]
                    latest[tp] = stored
        if self._target is not None:
            for tp in partitions:
                cap = self._target.get(tp)
                if cap is None or (latest[tp] is not None and latest[tp] > cap):  # type: ignore[operator]
                    latest[tp] = cap if tp in self._target else None
        return latest

    def _due(self, partitions: Sequence[str], now: float) -> list[str]:
        """The topic-partitions whose latest position this trigger asks for: those with something new at the
        last look, and the quiet ones every ``idlePollSeconds``. All of them for ``Trigger.AvailableNow`` (its
        target is fixed once) and with ``idlePollSeconds`` 0 (the source's default; the offload job sets 2 s).
        A job over thousands of mostly quiet topic-partitions then asks about the active ones and a slice of
        the rest per trigger, not about all."""
        if self._target is not None or self.options.idle_poll_s <= 0:
            return list(partitions)
        changed = self._held.changed() if self._held is not None else set()
        return [tp for tp in partitions if self._next_lookup.get(tp, 0.0) <= now or tp in changed]

    def _quiet_interval(self, tp: str) -> float:
        """When a quiet topic-partition is asked about again: ``idlePollSeconds``, or ``watchedPollSeconds`` when
        its held consumer watches it (the broker pushes the next entry, and ``_due`` asks then); spread over
        [0.75, 1.25] of it by the topic's name (stable across runs), so the quiet topic-partitions are asked
        about a slice at a time rather than all in one trigger."""
        spread = zlib.crc32(tp.encode()) / 0xFFFFFFFF
        watched = self._held is not None and self._held.armed(tp)
        return (self.options.watched_poll_s if watched else self.options.idle_poll_s) * (0.75 + 0.5 * spread)

    def _let_go_of(self, tp: str, consumed: Position) -> None:
        """``tp`` was read up to ``consumed`` and the broker says it does not exist any more: it was deleted.
        Nothing was lost here (what was read is offloaded, or will be at the segment's rollover); its position
        stays in the offset, so a topic created again under the name is read from there on (Pulsar's new
        ledgers come after it), and the next trigger lists the namespace again to let go of it."""
        if tp not in self._let_go:
            self._let_go.add(tp)
            self._discovered_at = float("-inf")
            log.warning(
                "pulsar source: %s does not exist on the broker any more (deleted?); let go after %d:%d, "
                "its offloaded segments stay",
                tp,
                consumed[0],
                consumed[1],
            )

    def _latest_batch(self, partitions: Sequence[str]) -> dict[str, Any]:
        """The pipelined lookup; raises when it answered nothing (the broker is unreachable), so that the
        whole batch is retried rather than each topic-partition on its own."""
        if self.options.watched_poll_s <= 0:  # no consumer held between triggers (no watches)
            batch = latest_positions_raw(self.raw_client, partitions)
        else:
            if self._held is None:
                self._held = HeldPositions(self.raw_client)
            batch = self._held.ask(partitions)
        # A topic that does not exist is an answer: a broker that gave one is reachable.
        failures = [got for got in batch.values() if isinstance(got, PulsarIOError)]
        if failures and len(failures) == len(batch) and not any(isinstance(f, TopicNotFoundError) for f in failures):
            raise failures[0]
        return batch

    def _recheck_latest(self, tp: str, consumed: Position, latest: Position | None) -> Position | None:
        """A latest position before what was consumed means lost entries, or a broker answering
        early after a restart (pulsar-lite calls a topic it has not loaded yet empty): ask again."""
        for _ in range(3):
            time.sleep(0.5)
            latest = self.latest_positions([tp])[tp]
            if not _went_back(latest, consumed):
                break
        return latest

    def initial_offset(self) -> dict[str, list[int]]:
        partitions = self.topic_partitions(force=True)
        if self.options.starting_time is not None:
            at_time = self._starts_at_time(partitions, self.options.starting_time)
            self._consumed = dict(at_time)
            return offsets_json(at_time)
        spec = self.options.starting_offsets
        latest: dict[str, Position | None] = {}
        wants_latest = spec == "latest" or (isinstance(spec, dict) and "latest" in spec.values())
        if wants_latest:
            latest = self.latest_positions(partitions)
        start: dict[str, Position] = {}
        for tp in partitions:
            choice: Position | str = spec if isinstance(spec, str) else spec.get(tp, spec.get("*", "earliest"))
            if choice == "earliest":
                start[tp] = BEFORE_EARLIEST
            elif choice == "latest":
                start[tp] = latest.get(tp) or BEFORE_EARLIEST
            else:
                start[tp] = choice  # type: ignore[assignment]
        if isinstance(spec, dict):
            unknown = sorted(set(spec) - set(partitions) - {"*"})
            if unknown:
                log.warning("pulsar source: startingOffsets names topic-partitions not read: %s", unknown)
        self._consumed = dict(start)
        return offsets_json(start)

    def _starts_at_time(self, partitions: Sequence[str], at_ms: int) -> dict[str, Position]:
        """``startingTime``: per topic-partition, the position before its first entry published at ``at_ms`` or
        later: in the store (read-through) or on the broker; after its latest entry when nothing is that recent."""
        latest = self.latest_positions(partitions)
        start: dict[str, Position] = {}
        keyring = KeyRing.with_file(self.options.offloaded_keys_file)  # encrypted segments: offloaded.keysFile
        reader = TopicReader(self._tier.scoped, keyring=keyring) if self._tier is not None else None
        try:
            for tp in partitions:
                found: Position | None = None
                if reader is not None:
                    found = stored_position_at(reader, tp, reader.metadata.offloaded_segments(tp), at_ms)
                if found is None:
                    found = broker_position_at(partial(self._broker_next, tp), latest[tp], at_ms)
                start[tp] = (found[0], found[1] - 1) if found is not None else latest[tp] or BEFORE_EARLIEST
                log.info("pulsar source: %s starts after %s (startingTime %d)", tp, start[tp], at_ms)
        finally:
            if reader is not None:
                reader.close()
        return start

    def prepare_available_now(self) -> None:
        partitions = self.topic_partitions(force=True)
        self._target = None
        self._target = self.latest_positions(partitions)

    def latest_offset(self, start: Mapping[str, Any], max_entries: int | None, max_bytes: int | None) -> dict[str, Any]:
        with self._lock:
            start_positions, sealed = split_offsets(start)
            end: dict[str, Any] = self._latest_offset(start_positions, max_entries, max_bytes)
            if not (self.options.seal_at_end and self._target is not None):
                return self._with_wake(start, start_positions, end)
            moved = any(position_of(pos) > start_positions.get(tp, BEFORE_EARLIEST) for tp, pos in end.items())
            if moved:
                self._read_any = True
                # This micro-batch reads the last of the AvailableNow target: its seal markers come with it
                # (``partitions``; the segmenter takes a key's entries before its controls), not in a micro-batch
                # of their own, which cost a run --once ~0.3 s of planning, tasks and commits.
                sealed = sealed or self._reaches_target(end)
            elif self._read_any and not sealed:
                # Everything up to the AvailableNow target was read (some of it not in reach when the last entries
                # were: paused, or let go of): one more micro-batch, of seal markers, so the open segments are
                # sealed in this query, after all their entries.
                sealed = True
            if sealed:
                end[SEALED_KEY] = True
            return end

    def _reaches_target(self, end: Mapping[str, object]) -> bool:
        """Whether ``end`` is at or past the AvailableNow target of every topic-partition with one."""
        target = self._target or {}
        for tp, cap in target.items():
            value = end.get(tp)
            if cap is not None and (value is None or position_of(value) < cap):
                return False
        return True

    def _with_wake(
        self, start: Mapping[str, Any], start_positions: Mapping[str, Position], end: dict[str, Any]
    ) -> dict[str, Any]:
        """``end`` with ``WAKE_KEY``: carried over from ``start`` (an offset that changes is a micro-batch), or
        set to now when nothing moved and a timer is due (see ``WAKE_KEY``). Only in the offload job (which
        writes the buffer file the due timers are read from)."""
        if self._buffers is None:
            return end
        now = time.monotonic()
        woken = start.get(WAKE_KEY)
        moved = any(position_of(pos) != start_positions.get(tp, BEFORE_EARLIEST) for tp, pos in end.items())
        if moved:
            self._planned_at = now
        else:
            written, next_wake = self._buffers.wake()
            now_ms = int(time.time() * 1000)
            due = (
                not written  # this run has had no micro-batch yet: its restored timers are unknown
                or (next_wake is not None and next_wake <= now_ms and (woken is None or int(woken) < next_wake))
                or now - self._planned_at >= WAKE_FALLBACK_S
            )
            if due:
                self._planned_at = now
                woken = now_ms
        if woken is not None:
            end[WAKE_KEY] = int(woken)
        return end

    def _latest_offset(
        self, start_positions: Mapping[str, Position], max_entries: int | None, max_bytes: int | None
    ) -> dict[str, list[int]]:
        self._round += 1
        start = dict(start_positions)
        partitions = self.topic_partitions()
        if self._target is not None:
            partitions = [tp for tp in partitions if tp in self._target]
        now_ms = int(time.time() * 1000)
        if self._policies is not None:
            paused = [tp for tp in partitions if not self._policies.enabled(tp, now_ms)]
            if paused:
                gone = set(paused)
                partitions = [tp for tp in partitions if tp not in gone]
            for tp in paused:  # disabled: the offset stays where it is, nothing is read or skipped
                start.setdefault(tp, self._consumed.get(tp, BEFORE_EARLIEST))
        if self._quarantine is not None:
            # Set aside after failing again and again (streaming.governance.quarantine): paused like a disabled topic.
            held = [tp for tp in partitions if self._quarantine.paused(tp, now_ms)]
            if held:
                aside = set(held)
                partitions = [tp for tp in partitions if tp not in aside]
            for tp in held:
                start.setdefault(tp, self._consumed.get(tp, BEFORE_EARLIEST))
        if self._held is not None:
            self._held.keep_only(partitions)  # no longer discovered, disabled or set aside: not asked about
        now = time.monotonic()
        due = self._due(partitions, now)
        latest = self.latest_positions(due)
        asked = set(due)  # looked up below once per topic-partition: a list would cost 10,000 x 10,000 compares
        for tp in partitions:
            if tp not in latest:  # quiet when last asked, and not due yet: nothing new as far as we know
                latest[tp] = self._latest.get(tp)
        end = dict(start)  # topic-partitions no longer discovered (or paused) keep their position
        pending: list[str] = []
        absent = self._absent
        if absent:
            absent.intersection_update(partitions)  # what is no longer discovered is forgotten here too
            self._let_go.intersection_update(absent)
        for tp in partitions:
            s = start.get(tp, BEFORE_EARLIEST)
            end.setdefault(tp, s)
            last = latest[tp]
            if tp in absent and s > BEFORE_EARLIEST:
                self._let_go_of(tp, s)
                continue
            if _went_back(last, s):
                last = latest[tp] = self._recheck_latest(tp, s, last)
            if _went_back(last, s):
                what = "is empty now" if last is None else f"ends at {last[0]}:{last[1]}"
                message = f"{tp}: the source read up to {s[0]}:{s[1]} but the topic {what}: entries were lost"
                if self.options.fail_on_data_loss:
                    lost = DataLossError(message + " (set failOnDataLoss=false to go on from the broker's position)")
                    raise TopicFailedError(tp, lost) from lost
                log.warning("%s; going on from there (failOnDataLoss=false)", message)
                end[tp] = last or BEFORE_EARLIEST
                continue
            if last is not None and last > s:
                pending.append(tp)
                self._next_lookup.pop(tp, None)
            elif tp in asked:
                self._next_lookup[tp] = now + self._quiet_interval(tp)
        self._latest.update(latest)
        self._known_ends = {}
        rooms = self.buffer_rooms(pending, now_ms)
        if self._buffers is not None:  # measured sizes (refreshed by buffer_rooms) beat one sampled entry
            self._entry_size.update(self._buffers.entry_bytes)
        full = [tp for tp in pending if rooms.get(tp, 1) <= 0]
        if full:
            # At its buffer bound: nothing new this micro-batch; the others still get entries.
            log.info("pulsar source: offload buffer at its bound, not admitted this trigger: %s", full)
            pending = [tp for tp in pending if tp not in full]
        if max_entries is None and max_bytes is None and not rooms:
            for tp in pending:
                end[tp] = latest[tp]  # type: ignore[assignment]
                self._known_ends[tp] = end[tp]
        else:
            self._admit(pending, start, latest, end, max_entries, max_bytes, rooms)
        for tp in partitions:
            self._consumed[tp] = start.get(tp, BEFORE_EARLIEST)
        self._write_backlog()
        return offsets_json(end)

    def _admit(
        self,
        pending: list[str],
        start: Mapping[str, Position],
        latest: Mapping[str, Position | None],
        end: dict[str, Position],
        max_entries: int | None,
        max_bytes: int | None,
        rooms: Mapping[str, int] | None = None,
    ) -> None:
        """Set ``end`` for the ``pending`` topic-partitions: at most ``max_entries`` / about ``max_bytes``
        in all, split max-min fairly, and at most ``rooms[tp]`` bytes (but one entry) for a
        topic-partition with a buffer room (see :meth:`buffer_rooms`)."""
        rooms = rooms or {}
        firsts: dict[str, Position] = {}
        available: dict[str, int | None] = {}
        for tp in pending:
            s = start.get(tp, BEFORE_EARLIEST)
            last = latest[tp]
            assert last is not None
            if s[0] == last[0]:
                firsts[tp] = (s[0], s[1] + 1)
                available[tp] = last[1] - s[1]
                if (max_bytes is not None or tp in rooms) and tp not in self._entry_size:
                    self._probe(tp, s)
            else:
                # The next entry is in a later ledger than the last one consumed (or the first ever):
                # where it is, the driver learns by reading it (no admin API for ledger lists).
                probe = self._probe(tp, s)
                if probe is None:
                    log.warning("pulsar source: %s: no entry after %s arrived; retrying next trigger", tp, s)
                    continue
                firsts[tp] = probe.position
                available[tp] = last[1] - probe.position[1] + 1 if probe.position[0] == last[0] else None
        admitted = list(firsts)
        if not admitted:
            return
        sizes = [max(self._entry_size.get(tp, 1.0), 1.0) for tp in admitted]
        demands: list[int | None] = []
        for tp, size in zip(admitted, sizes, strict=True):
            demand = available[tp]
            room = rooms.get(tp)
            if room is not None:
                # What fits in the buffer's room, but at least one entry: below the bound a topic-partition
                # always moves (a room smaller than one entry would otherwise stall it for good).
                fits = max(1, int(room // size))
                demand = fits if demand is None else min(demand, fits)
            demands.append(demand)
        allowed: list[int | None] = list(demands)
        if max_entries is not None:
            allowed = list(fair_shares(demands, max_entries, self._round))
        if max_bytes is not None:
            byte_demands = [None if d is None else math.ceil(d * size) for d, size in zip(demands, sizes, strict=True)]
            shares = fair_shares(byte_demands, max_bytes, self._round)
            # A share that covers the whole demand admits all of it: dividing it back by a fractional mean
            # size could round one entry off, and leave it for a micro-batch of its own.
            by_bytes = [
                d if d is not None and share >= bd else int(share // size)  # type: ignore[operator]
                for d, bd, share, size in zip(demands, byte_demands, shares, sizes, strict=True)
            ]
            allowed = [b if a is None else min(a, b) for a, b in zip(allowed, by_bytes, strict=True)]
            if not any(allowed):
                allowed[self._round % len(admitted)] = 1  # an entry over the byte limit goes alone
        if self._target is not None:
            allowed = [even_share(available[tp], count) for tp, count in zip(admitted, allowed, strict=True)]
        for tp, count in zip(admitted, allowed, strict=True):
            last = latest[tp]
            assert last is not None
            if count is None:  # no limit for this one (a buffer room only bounds the others)
                end[tp] = last
                self._known_ends[tp] = last
                continue
            if count <= 0:
                continue
            first = firsts[tp]
            cap = (first[0], first[1] + count - 1)
            if first[0] == last[0]:
                end[tp] = min(cap, last)
                self._known_ends[tp] = end[tp]  # an entry of the latest ledger at or before latest
            else:
                end[tp] = cap  # may pass the end of its ledger: the range then ends there

    def buffer_rooms(self, partitions: Sequence[str], now_ms: int) -> dict[str, int]:
        """With ``bufferFile``: per topic-partition, the bytes it may still be admitted before its offload
        buffer reaches :func:`buffer_bound` (the policy in force now; 0 or less: at the bound). Empty
        without ``bufferFile``."""
        if self._buffers is None:
            return {}
        min_part, buffered = self._buffers.current()
        versions = self._policies.current() if self._policies is not None else None
        rooms: dict[str, int] = {}
        for tp in partitions:
            policy = versions.policy_at(tp, now_ms) if versions is not None and len(versions) else OffloadPolicy()
            rooms[tp] = buffer_bound(policy, min_part) - buffered.get(tp, 0)
        return rooms

    def _probe(self, tp: str, after: Position) -> Probe | None:
        probe = self._tier_probe(tp, after)
        if probe is None:
            probe = self._broker_next(tp, after)
        if probe is not None:
            old = self._entry_size.get(tp)
            self._entry_size[tp] = probe.approx_bytes if old is None else 0.7 * old + 0.3 * probe.approx_bytes
        return probe

    def _broker_next(self, tp: str, after: Position) -> Probe | None:
        """The broker's first entry after ``after``; with read-through through a ``BrokerFront`` (renewed every
        ``discoveryIntervalSeconds``), as the tasks read, since the broker may have dropped ``after``'s ledger."""
        if self._tier is not None:
            now = time.monotonic()
            known = self._fronts.get(tp)
            if known is None or now - known[0] >= self.options.discovery_interval_s:
                probe, latest = (lambda after: self._probe_broker_after(tp, after)), (lambda: self._latest_position(tp))
                known = self._fronts[tp] = (now, BrokerFront(probe, latest))
            return known[1].next_after(after)
        return self._probe_broker_after(tp, after)

    def _probe_broker_after(self, tp: str, after: Position) -> Probe | None:
        settings = self.options.reader_settings()
        if self.options.reader == "raw":
            return rr.probe_after_raw(self.raw_client, tp, after, settings=settings)
        return client_reader.probe_after(self.client, tp, after, settings=settings)

    def _tier_probe(self, tp: str, after: Position) -> Probe | None:
        """Read-through: the next position after ``after`` where the tasks will read it from the store
        (``read_through.read_through_range``'s rules), else None (the broker's next, probed as usual)."""
        if self._tier is None:
            return None
        history = self._tier.history(tp)
        nxt = history.next_after(after)
        if nxt is None:
            return None
        if after <= BEFORE_EARLIEST or gap(after, nxt):
            # Either side may hold the next entry: the broker's wins if it comes first (the store then has a
            # hole the broker fills, or the broker's history starts earlier); a missing entry is the tasks' to
            # report, with the read.
            broker = self._broker_next(tp, after)
            if broker is not None and broker.position < nxt:
                return broker
        span = history.span_holding(nxt)
        size = span.size // max(span.entries, 1) if span is not None else 1
        return Probe(nxt, 1, size)

    def cut_stored(self, ranges: list[Range]) -> list[Range]:
        """Read-through: each range's stored part cut in pieces of about ``STORED_PIECE_BYTES`` (at stored
        positions, which exist), so tasks read a stored backlog in parallel; at most ``maxPartitions`` in all."""
        if self._tier is None or not ranges:
            return ranges
        most = max(1, self.options.max_partitions // len(ranges))
        out: list[Range] = []
        for r in ranges:
            start = r.start
            for cut in self._tier.history(r.topic).stored_cuts(r.start, r.end, STORED_PIECE_BYTES, most):
                out.append(Range(r.topic, start, cut, True))
                start = cut
            out.append(Range(r.topic, start, r.end, r.end_known))
        return out

    def end_is_known(self, tp: str, end: Position) -> bool:
        return self._known_ends.get(tp) == end

    def commit(self, end_doc: Mapping[str, Any]) -> None:
        with self._lock:
            current = set(self._partitions)
            committed = split_offsets(end_doc)[0]
            self._consumed.update((tp, pos) for tp, pos in committed.items() if tp in current or not current)
            self._write_backlog()

    def latest_offset_report(self) -> dict[str, list[int]] | None:
        known = {tp: pos for tp, pos in self._latest.items() if pos is not None}
        return offsets_json(known) if known else None

    # --- backlog ------------------------------------------------------------------------------

    def backlog(self) -> dict[str, PartitionBacklog]:
        out: dict[str, PartitionBacklog] = {}
        for tp in sorted(set(self._latest) | set(self._consumed)):
            latest = self._latest.get(tp)
            consumed = self._consumed.get(tp, BEFORE_EARLIEST)
            entries, exact = entries_between(consumed, latest)
            size = self._entry_size.get(tp)
            out[tp] = PartitionBacklog(
                tp, latest, consumed, entries, exact, None if size is None else int(entries * size)
            )
        return out

    def _write_backlog(self) -> None:
        if self.options.backlog_file:
            write_backlog_file(self.options.backlog_file, self.backlog())

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._client is not None:
            client_reader.close_shared_clients()
            self._client = None


__all__ = [
    "SEALED_KEY",
    "WAKE_FALLBACK_S",
    "WAKE_KEY",
    "SourcePlanner",
    "even_share",
    "offset_positions",
    "offsets_json",
    "position_of",
    "split_offsets",
]
