"""``runtime.interleave``: generators run at once on threads, each one's items in order, bounded, the first error
raised, and every generator closed and every thread gone whenever the consumer stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from streamoffload.streaming.runtime.interleave import interleave


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_every_item_comes_once_and_each_generators_in_its_order() -> None:
    def produce(w: int) -> Iterator[tuple[int, int]]:
        for i in range(w):
            if i % 3 == 0:
                time.sleep(0.001)  # let the others in
            yield (w, i)

    got = list(interleave(range(20), produce, 4, name="t-order"))
    assert sorted(got) == [(w, i) for w in range(20) for i in range(w)]
    for w in range(20):
        assert [i for ww, i in got if ww == w] == list(range(w))
    assert threads_named("t-order") == []


def test_the_generators_run_at_once() -> None:
    """Four generators that each wait for all four to have started: one at a time, this would never end."""
    started = threading.Barrier(4, timeout=10)

    def produce(w: int) -> Iterator[int]:
        started.wait()
        yield w

    assert sorted(interleave(range(4), produce, 4)) == [0, 1, 2, 3]


def test_one_thread_runs_them_in_the_caller_one_after_the_other() -> None:
    callers: set[str] = set()

    def produce(w: int) -> Iterator[int]:
        callers.add(threading.current_thread().name)
        yield from (w, w)

    assert list(interleave([1, 2, 3], produce, 1)) == [1, 1, 2, 2, 3, 3]
    assert callers == {threading.current_thread().name}
    assert list(interleave([5], produce, 8)) == [5, 5], "one piece of work needs no thread"


def test_producers_wait_while_the_consumer_does_not_take() -> None:
    made = 0
    lock = threading.Lock()

    def produce(w: int) -> Iterator[int]:
        nonlocal made
        for i in range(1000):
            with lock:
                made += 1
            yield i

    items = interleave(range(3), produce, 3, name="t-bound")
    next(items)
    time.sleep(0.3)
    with lock:
        assert made <= 1 + 2 * 3 + 3, made  # the taken one, the queue's bound, one waiting in each producer
    items.close()
    assert threads_named("t-bound") == []


def test_the_first_error_is_raised_and_every_generator_is_closed() -> None:
    closed: list[int] = []

    def produce(w: int) -> Iterator[int]:
        try:
            if w == 2:
                raise ValueError("range 2 is broken")
            for i in range(100):
                time.sleep(0.001)
                yield i
        finally:
            closed.append(w)

    with pytest.raises(ValueError, match="range 2 is broken"):
        list(interleave(range(6), produce, 3, name="t-error"))
    assert 2 in closed
    assert threads_named("t-error") == []
    assert len(closed) == len(set(closed)), "each started generator closed once"


def test_a_consumer_that_stops_early_leaves_no_thread_and_no_open_generator() -> None:
    open_now: set[int] = set()

    def produce(w: int) -> Iterator[int]:
        open_now.add(w)
        try:
            while True:
                yield w
        finally:
            open_now.discard(w)

    items = interleave(range(5), produce, 3, name="t-close")
    assert next(items) in range(5)
    items.close()
    assert open_now == set()
    assert threads_named("t-close") == []
