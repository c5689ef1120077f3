"""The sink one micro-batch behind the source: ``foreachBatch`` hands a micro-batch's actions to
:class:`SinkPipeline` and returns, so Spark reads the next micro-batch from the broker while a driver thread
writes this one's parts and seals (DESIGN "Control plane and data plane": overlap).

Why it stays exact:

- **One micro-batch at a time, in batch order.** ``submit`` waits for the batch before (and raises its failure)
  before it starts this one, so each topic-partition's actions reach the store in the order the segmenter made
  them, and at most one micro-batch's writes are in flight: its bytes wait in the spool, bounded like any
  micro-batch (``maxBytesPerTrigger``).
- **A failure ends the run.** The segmenter of the next micro-batch went on as if the writes had succeeded, so
  nothing is written after a failure: ``submit`` and ``wait`` raise it until the pipeline is closed, and the
  next run recovers from the store's commits, as after any failure.
- **A kill** leaves what any kill of the sink leaves (a prefix of each topic-partition's commits, parts of
  uncommitted segments); the store is the truth, Spark's checkpoint is the run's scratch space, so Spark having
  moved past a micro-batch whose writes were lost changes nothing: the next run starts after the last commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.handoff.actions import Action, StatsAction
from streamoffload.streaming.sink.sink import SinkStats

log = logging.getLogger(__name__)


class PipelineClosedError(StreamingError):
    """A micro-batch was handed to a sink pipeline after its run ended."""


def segmenter_figures(actions: list[Action]) -> dict[str, StatsAction]:
    """Each topic-partition's last ``StatsAction`` among ``actions``: the segmenter's figures (its buffer, open
    segment, last position), known as soon as the actions are, before any of them is written."""
    return {action.topic: action for action in actions if isinstance(action, StatsAction)}


class SinkPipeline:
    """Writes micro-batches' actions on one background thread, each after the one before (module docstring).

    ``apply(batch_id, actions)`` writes one micro-batch's actions (``SegmentSink.apply``); ``done(batch_id,
    seconds, stats)`` runs on the same thread after it, with the seconds since the batch was handed over;
    ``failed(error)`` once, on that thread, when a batch fails (the job stops its query there: a continuous run
    may see no next batch)."""

    def __init__(
        self,
        apply: Callable[[int, list[Action]], SinkStats],
        done: Callable[[int, float, SinkStats], None],
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._apply = apply
        self._done = done
        self._failed = failed
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sink-pipeline")
        self._pending: Future[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def failure(self) -> BaseException | None:
        """The failure of a micro-batch's writes, once one failed."""
        return self._failure

    @property
    def busy(self) -> bool:
        """Whether a micro-batch's writes are in flight."""
        pending = self._pending
        return pending is not None and not pending.done()

    def submit(self, batch_id: int, actions: list[Action], started: float | None = None) -> None:
        """Write ``actions`` (micro-batch ``batch_id``) after the micro-batch before, in the background. Waits
        for that one first and raises its failure (then nothing more is written). ``started``: when the batch
        began (``time.monotonic``), for ``done``'s seconds."""
        self.wait()
        begun = time.monotonic() if started is None else started
        with self._lock:
            if self._closed:
                raise PipelineClosedError(f"micro-batch {batch_id}: the sink pipeline of this run is closed")
            self._pending = self._pool.submit(self._run, batch_id, actions, begun)

    def wait(self) -> None:
        """Until the micro-batch in flight is written; raises a failure of any micro-batch so far."""
        pending = self._pending
        if pending is not None:
            pending.result()
        if self._failure is not None:
            raise self._failure

    def close(self) -> BaseException | None:
        """End of the run: wait for the writes in flight, take no more; the failure, if any, is returned (the
        run is ending either way)."""
        with self._lock:
            self._closed = True
        try:
            self.wait()
        except BaseException as err:
            self._failure = self._failure or err
        finally:
            self._pool.shutdown(wait=True)
        return self._failure

    def _run(self, batch_id: int, actions: list[Action], started: float) -> None:
        if self._failure is not None:  # a batch before failed: write nothing after it
            raise self._failure
        try:
            stats = self._apply(batch_id, actions)
            self._done(batch_id, time.monotonic() - started, stats)
        except BaseException as err:
            self._failure = err
            log.error("micro-batch %d: writing its parts failed: %s", batch_id, err)
            if self._failed is not None:
                try:
                    self._failed(err)
                except Exception:
                    log.warning("stopping the run after a sink failure failed", exc_info=True)
            raise
