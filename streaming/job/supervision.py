"""Supervising the offload job's runs: ``run --once`` (drain, seal every open segment, set a
failing topic aside and go on without it) and ``run`` (start a new run after a failure, with backoff; wait
for an unreachable broker without giving up).

Part of :class:`~streamoffload.streaming.job.offload_job.OffloadJob` (``JobSupervision``)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamoffload.checkpoints.lease import CleanupRunningError, FencedError, LeaseHeldError
from streamoffload.errors import StreamOffloadError
from streamoffload.streaming.governance.quarantine import failed_topics, failure_reason
from streamoffload.streaming.job.health import BROKER_BACKOFF_CAP_S, broker_unreachable
from streamoffload.streaming.job.runs import JobRuns, LeaseUnrenewableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from streamoffload.codecs.positions import Position

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerLatest:
    """The topic-partitions a run reads and each one's latest position on the broker (None: it has no entry), as
    asked once at ``run --once``'s start (``JobSupervision.broker_latest``)."""

    partitions: tuple[str, ...]
    latest: Mapping[str, Position | None]


def _wait(query: StreamingQuery, seconds: int) -> None:
    """Wait for the query to end, at most ``seconds``. A failure is not raised here: Spark raises it from
    ``awaitTermination`` only when the wait overlaps the failure, so callers read ``query.exception()``
    after the loop instead, every time."""
    from pyspark.errors import StreamingQueryException

    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(seconds)


class JobSupervision(JobRuns):
    """``run_once`` and ``run_forever``, and what they do about failures: of the runs (``JobRuns``)."""

    def run_once(self, spark: SparkSession) -> None:
        """Drain everything available, then seal every open segment. A topic-partition whose offload fails
        is set aside (``streaming.governance.quarantine``) and the run starts again without it, so the other topics are
        offloaded; the run then fails, naming it."""
        self.failed_topics = {}
        while True:
            if self.run is None:
                self.begin_run()
            try:
                self._drain_and_seal(spark)
                break
            except Exception as err:  # Spark's StreamingQueryException carries the executor's message
                held = self._set_aside(str(err), at_once=True)
                if not held or any(topic in self.failed_topics for topic in held):
                    raise
                self.failed_topics.update({t: failure_reason(str(err), t) for t in held})
            finally:
                self.end_run()
        if self.failed_topics:
            listed = "; ".join(f"{topic}: {why}" for topic, why in sorted(self.failed_topics.items()))
            raise StreamOffloadError(
                f"the other topics were offloaded, but {len(self.failed_topics)} topic-partition(s) failed and were "
                f"set aside (see `streamoffload status`): {listed}"
            )

    def _set_aside(self, error_text: str, *, at_once: bool = False) -> list[str]:
        """Count a failure against the topic-partitions the error names (``TopicFailedError``); returns those
        now set aside. ``at_once``: without waiting for a second failure (a batch run will not retry)."""
        if self.quarantine is None:
            return []
        held: list[str] = []
        for topic in failed_topics(error_text):
            reason = failure_reason(error_text, topic)
            record = self.quarantine.note_failure(topic, reason, at_once=at_once)
            if record.quarantined:
                held.append(topic)
                until = time.strftime("%H:%M:%S", time.localtime(record.until_ms / 1000))
                log.error(
                    "%s: offload failed %d time(s) in a row (%s); set aside until %s, the other topics go on",
                    topic,
                    record.failures,
                    reason,
                    until,
                )
            else:
                log.warning("%s: offload failed (%s); trying again", topic, reason)
        return held

    def broker_latest(self) -> BrokerLatest | None:
        """For ``run --once``, after ``begin_run``: the topic-partitions to offload and each one's latest position on
        the broker, asked once (``nothing_new`` and the progress's backlog both read it). None when the broker cannot
        be asked: the query then finds out."""
        from streamoffload.streaming.source.offset_planner import SourcePlanner
        from streamoffload.streaming.source.source_options import SourceOptions

        try:
            planner = SourcePlanner(SourceOptions.parse(self.source_options()))
            try:
                partitions = planner.topic_partitions(force=True)
                latest = planner.latest_positions(partitions)
            finally:
                planner.close()
        except Exception as err:
            log.info("could not ask the broker for the latest positions (%s): running the query", err)
            return None
        return BrokerLatest(tuple(partitions), latest)

    def nothing_new(self, latest: BrokerLatest | None) -> bool:
        """For ``run --once``, after ``begin_run``: whether every topic-partition is offloaded up to the broker's
        latest position (``latest``, from ``broker_latest``) and no offload-now request waits, so that the query
        would start Spark only to find nothing (recovery has abandoned every unfinished attempt, and ``run --once``
        leaves no open segment). Any doubt (the broker or the store could not be asked) answers False: the query
        then finds out."""
        from streamoffload.checkpoints.control_requests import pending_requests

        run = self.run
        if run is None or latest is None:
            return False
        try:
            if pending_requests(self.location.open()):
                return False
        except Exception as err:
            log.info("could not tell whether anything is new (%s): running the query", err)
            return False
        for tp in latest.partitions:
            last = latest.latest.get(tp)
            if last is None:
                continue  # an empty topic-partition
            committed = run.resume.get(tp, (None, 0))[0]
            if committed is None or tuple(committed) < tuple(last):
                return False
        return True

    def _drain_and_seal(self, spark: SparkSession) -> None:
        """One query: it reads up to the positions of its start (``Trigger.AvailableNow``), and its last
        micro-batch seals every open segment (the source's seal markers), so nothing that arrives meanwhile
        lands unbounded in one batch: it waits for the next run."""
        self._await(self.start(spark, once=True))
        self.retention_runner().run_pass()
        self.sync_tables()

    def sync_tables(self) -> None:
        """``run --once``'s end: sync the table of every topic whose policy has ``offloadTable`` on, now (a failure
        is logged and counted: the offload is done either way)."""
        self.table_follower().sync_all(self.last_topic_stats)

    def _await(self, query: StreamingQuery) -> None:
        while query.isActive:
            if self._stop.is_set():
                query.stop()
                raise StreamOffloadError("stopped before the run finished; the next run continues from the store")
            self._watch_policy_or_retry()
            _wait(query, 1)
        if self._fenced is not None:
            raise self._fenced
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        # The last micro-batch's writes (overlap) first: a failure there stopped the query, and names its topic.
        failure = self.finish_writes()
        if failure is not None:
            raise failure
        if self.query is not None and self.query.exception() is not None:
            raise StreamOffloadError(f"offload query failed: {self.query.exception()}")

    def stop(self) -> None:
        """Ask the job to stop: safe from a signal handler (it only sets a flag); the running loop stops
        the query, since calling into Spark from a handler re-enters the py4j call the main thread is in."""
        self._stop.set()

    def run_forever(
        self,
        spark: SparkSession,
        *,
        max_restarts: int = 10,
        backoff_s: float = 5.0,
        broker_backoff_cap_s: float = BROKER_BACKOFF_CAP_S,
    ) -> None:
        """Run until ``stop``; after a failure (of the query, or of a run's start), start a new run
        (recovering from the store) with backoff. Gives up after ``max_restarts`` failures in a row without
        progress; stops at once when fenced. While the broker is unreachable it never gives up: it tries
        again with backoff capped at ``broker_backoff_cap_s`` (at once when the broker answers again), and
        says so in the log, the store's health record (``status``) and ``streamoffload_broker_unreachable``."""
        failures = 0
        if self.health.scoped is None:
            self.health.scoped = self.location.open()
            self.health.clear_stale()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                query: StreamingQuery | None = None
                error: BaseException | None
                try:
                    if self.run is None:
                        self.begin_run()
                    query = self.start(spark)
                    if self.health.current.broker_unreachable:
                        self._broker_back()
                except CleanupRunningError as err:  # `cleanup` holds the lease for a moment: wait for it
                    log.warning("%s; starting when it is done", err)
                    self._stop.wait(backoff_s)
                    continue
                except (FencedError, LeaseHeldError):
                    raise
                except Exception as err:  # e.g. the store or the broker is away while a run starts
                    error = err
                else:
                    while not self._stop.is_set() and query.isActive:
                        self._watch_policy_or_retry()
                        _wait(query, 1)
                    if self._fenced is not None and not isinstance(self._fenced, LeaseUnrenewableError):
                        raise self._fenced
                    if self._stop.is_set():
                        query.stop()
                        break
                    # Fenced by our own renewals failing (the store was away): nobody else holds the lease
                    # unless the next run's ``begin_run`` says so (LeaseHeldError), so this is a failure to retry.
                    # A micro-batch's failed writes (overlap) stopped the query: their error names the topic.
                    error = self._fenced or self.finish_writes() or query.exception()
                    if error is None:
                        break
                held = self._set_aside(str(error))
                self.end_run(release=False)
                self.health.restarted()
                if held:  # isolated: the next run goes on without them, at once
                    failures = 0
                    continue
                cause = broker_unreachable(self.config.pulsar.service_url)
                if cause is not None:
                    self._wait_for_broker(cause, backoff_s, broker_backoff_cap_s)
                    continue
                self._broker_back()
                if "CommitConflictError" in str(error) or "FencedError" in str(error):
                    log.warning("a segment commit was refused (%s); recovering from the store", error)
                # A run that lasted or made progress starts a new series: only failures in a row give up.
                failures = 1 if time.monotonic() - started >= 300 or _made_progress(query) else failures + 1
                if failures > max_restarts:
                    raise StreamOffloadError(f"offload query failed {failures} times in a row; last error: {error}")
                delay = min(backoff_s * 2 ** (failures - 1), 300.0)
                named = failed_topics(str(error))
                if named:  # the first failure of these topics: retried before they are set aside
                    log.error("offload of %s failed; recovering from the store in %.0f s", ", ".join(named), delay)
                else:
                    log.error("offload query failed (%s); recovering from the store in %.0f s", _one_line(error), delay)
                self._stop.wait(delay)
        finally:
            self.end_run()

    def _wait_for_broker(self, cause: str, backoff_s: float, cap_s: float) -> None:
        """Until the broker answers again (or ``stop``): no run is started meanwhile, since none could read.
        Each attempt says so in one line and waits with exponential backoff capped at ``cap_s``, probing
        every second so that a broker back early is used at once."""
        url = self.config.pulsar.service_url
        unreachable: str | None = cause
        while unreachable is not None and not self._stop.is_set():
            attempt = self.health.current.attempts + 1
            delay = min(backoff_s * 2 ** (attempt - 1), cap_s)
            health = self.health.broker_down(unreachable, delay)
            since = time.strftime("%H:%M:%S", time.localtime(health.since_ms / 1000))
            (log.error if attempt == 1 else log.warning)(
                "broker %s unreachable: %s; retrying in %.0f s (attempt %d, unreachable since %s)",
                url,
                unreachable,
                delay,
                attempt,
                since,
            )
            deadline = time.monotonic() + delay
            while not self._stop.wait(min(1.0, delay)) and time.monotonic() < deadline:
                if broker_unreachable(url) is None:
                    break
            unreachable = broker_unreachable(url)
        self._broker_back()

    def _broker_back(self) -> None:
        """The broker answers again (or never was away): end the outage record, if there is one."""
        if broker_unreachable(self.config.pulsar.service_url) is not None:
            return
        ended = self.health.broker_up()
        if ended is not None:
            log.warning(
                "broker %s reachable again after %.0f s unreachable; recovering from the store",
                ended.broker_url,
                time.time() - ended.since_ms / 1000,
            )


def _made_progress(query: StreamingQuery | None) -> bool:
    """Whether a failed query had completed a micro-batch (then its failure starts a new series)."""
    if query is None:
        return False
    try:
        return query.lastProgress is not None
    except Exception:
        return False


_CAUSE_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception): \S")


def _one_line(error: BaseException | str) -> str:
    """An error as one line naming its cause. Spark wraps a Python failure as "An exception was raised by the
    Python Proxy. Return Message: Traceback ..." followed by the JVM stack: the cause is the traceback's last
    ``SomeError: why`` line that is not a JVM class."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    causes = [
        line.strip()
        for line in text.splitlines()
        if _CAUSE_LINE.match(line.strip()) and not line.strip().startswith(("org.", "java.", "py4j.", "scala."))
    ]
    return (causes[-1] if causes else text.splitlines()[0])[:500]
