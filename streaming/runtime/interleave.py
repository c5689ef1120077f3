"""Several generators run at once on threads, their items handed out as they come.

The source task's reads wait on the broker far longer than they compute (a subscription, a dispatch, an
unsubscribe: round trips to a broker that is itself busy), so a task reading ~150 short ranges one after the
other spent most of its time waiting: ~65% of a source task's samples were in a socket read at 10,000
topic-partitions (``py-spy``, bench/README, issue 24). :func:`interleave` runs up to ``threads`` of them at once.

Each generator's items come in its own order; items of different generators interleave. Bounded: the threads
stop producing while ``2 * threads`` items wait to be taken. The first error any of them raises is raised to the
consumer, after the others were told to stop; and whenever the consumer stops (an error, ``close``, the end),
every thread has finished and every generator started was closed (its ``finally`` ran: a reader's consumer
closed, a spool file abandoned) before :func:`interleave` returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
W = TypeVar("W")

_PUT_POLL_S = 0.05
"""How often a producer blocked on a full queue checks whether the consumer has gone."""


class _Done:
    """A thread's last item: it has nothing more."""


_DONE = _Done()
_NO_MORE = object()


def interleave(
    work: Iterable[W], produce: Callable[[W], Iterator[T]], threads: int, *, name: str = "interleave"
) -> Iterator[T]:
    """The items of ``produce(w)`` for every ``w`` of ``work``, up to ``threads`` generators at a time."""
    items = list(work)
    threads = max(1, min(threads, len(items)))
    if threads == 1:
        for w in items:
            yield from produce(w)
        return
    handed: queue.Queue[Any] = queue.Queue(maxsize=2 * threads)
    stop = threading.Event()
    todo = iter(items)
    todo_lock = threading.Lock()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            while not stop.is_set():
                with todo_lock:
                    w = next(todo, _NO_MORE)
                if w is _NO_MORE:
                    return
                generator = produce(w)  # type: ignore[arg-type]
                try:
                    for item in generator:
                        if not put(item):
                            return
                finally:
                    close = getattr(generator, "close", None)
                    if close is not None:
                        close()
        except BaseException as err:  # handed to the consumer, who raises it
            put(_Failed(err))
        finally:
            put(_DONE)

    workers = [threading.Thread(target=run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    try:
        running = threads
        while running:
            item = handed.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, _Failed):
                raise item.error
            else:
                yield item
    finally:
        stop.set()
        for worker in workers:
            worker.join()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


__all__ = ["interleave"]
