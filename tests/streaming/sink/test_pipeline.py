"""The sink pipeline (``streaming.sink.pipeline``): a micro-batch's writes run behind ``foreachBatch``, one
micro-batch at a time in batch order, and nothing is written after a failure."""

from __future__ import annotations

import threading

import pytest

from streamoffload.streaming.governance.quarantine import TopicFailedError
from streamoffload.streaming.handoff.actions import Action, StatsAction
from streamoffload.streaming.sink.pipeline import PipelineClosedError, SinkPipeline, segmenter_figures
from streamoffload.streaming.sink.sink import SinkStats


def stats_action(topic: str, buffered: int) -> StatsAction:
    return StatsAction(topic, buffered, None, 0, 0, None, None, 0, 0, 0, None, 0.0)


class Recorder:
    """An ``apply`` that records what it wrote; batch ``block`` waits for ``release``."""

    def __init__(self, block: int | None = None, fail: int | None = None) -> None:
        self.events: list[str] = []
        self.block, self.fail = block, fail
        self.release = threading.Event()
        self.started = threading.Event()
        self.done: list[tuple[int, SinkStats]] = []
        self.failures: list[BaseException] = []

    def apply(self, batch_id: int, actions: list[Action]) -> SinkStats:
        (batch,) = {int(a.topic.rsplit("-", 1)[1]) for a in actions}
        assert batch == batch_id
        self.events.append(f"start {batch}")
        self.started.set()
        if batch == self.block:
            assert self.release.wait(30)
        if batch == self.fail:
            raise TopicFailedError(f"t-{batch}", "the store refused a part")
        self.events.append(f"end {batch}")
        return SinkStats(parts=batch)

    def on_done(self, batch_id: int, _seconds: float, stats: SinkStats) -> None:
        self.done.append((batch_id, stats))

    def pipeline(self) -> SinkPipeline:
        return SinkPipeline(self.apply, self.on_done, self.failures.append)


def test_submit_returns_while_the_batch_is_written_and_the_next_one_waits_for_it() -> None:
    rec = Recorder(block=0)
    pipeline = rec.pipeline()
    pipeline.submit(0, [stats_action("t-0", 1)])
    assert rec.started.wait(30)
    assert pipeline.busy, "submit returned while micro-batch 0 is still being written"
    assert rec.events == ["start 0"]
    second = threading.Thread(target=pipeline.submit, args=(1, [stats_action("t-1", 2)]))
    second.start()
    rec.release.set()
    second.join(30)
    pipeline.wait()
    assert rec.events == ["start 0", "end 0", "start 1", "end 1"]
    assert [(b, s.parts) for b, s in rec.done] == [(0, 0), (1, 1)]
    assert pipeline.close() is None
    with pytest.raises(PipelineClosedError, match="micro-batch 2: the sink pipeline of this run is closed"):
        pipeline.submit(2, [stats_action("t-2", 0)])


def test_after_a_failure_nothing_more_is_written_and_the_failure_is_raised_until_the_end() -> None:
    rec = Recorder(fail=0)
    pipeline = rec.pipeline()
    pipeline.submit(0, [stats_action("t-0", 1)])
    with pytest.raises(TopicFailedError, match="t-0: the store refused a part"):
        pipeline.submit(1, [stats_action("t-1", 1)])
    with pytest.raises(TopicFailedError):
        pipeline.wait()
    assert rec.events == ["start 0"], "micro-batch 1 was never written"
    assert rec.done == []
    assert [str(f) for f in rec.failures] == [str(pipeline.failure)]
    failure = pipeline.close()
    assert isinstance(failure, TopicFailedError) and failure.topic == "t-0"


def test_close_waits_for_the_batch_in_flight() -> None:
    rec = Recorder(block=3)
    pipeline = rec.pipeline()
    pipeline.submit(3, [stats_action("t-3", 0)])
    assert rec.started.wait(30)
    closer = threading.Thread(target=pipeline.close)
    closer.start()
    rec.release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert rec.events == ["start 3", "end 3"] and [b for b, _ in rec.done] == [3]


def test_the_segmenter_figures_are_each_topics_last() -> None:
    first, later, other = stats_action("a", 1), stats_action("a", 5), stats_action("b", 2)
    assert segmenter_figures([first, other, later]) == {"a": later, "b": other}
