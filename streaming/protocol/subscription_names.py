"""Names for the readers' non-durable subscriptions, reused once their subscription is gone.

Every micro-batch subscribes anew to each topic-partition it reads (and once more to ask its last
position). pulsar-lite records every subscription name it has ever seen in its metadata, even after an
unsubscribe, and each new subscription costs more the more names it holds: in a 10-minute soak over 100
topic-partitions a subscribe went from ~1 to ~3 ms of broker CPU and kept rising. A name used again after
its unsubscribe costs nothing more (0.5 ms, flat). Real Pulsar forgets a non-durable subscription with
its last consumer, so reuse is harmless there.

A name is unique to this process (a random prefix, new in every forked child) and to one open consumer
at a time: a second Exclusive consumer under a name in use is refused. A name goes back to the pool only
after the broker confirmed its unsubscribe; otherwise it may still be in use, and is dropped.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid

PREFIX = "streamoffload-raw-"


class SubscriptionNames:
    """Per topic, the names free to subscribe under; new names when none is free."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every name (a forked child must not use its parent's)."""
        self._lock = threading.Lock()
        self._process = uuid.uuid4().hex[:12]
        self._serial = itertools.count()
        self._free: dict[str, list[str]] = {}

    def take(self, topic: str) -> str:
        with self._lock:
            free = self._free.get(topic)
            if free:
                return free.pop()
            return f"{PREFIX}{self._process}-{next(self._serial)}"

    def give_back(self, topic: str, name: str) -> None:
        """``name``'s subscription on ``topic`` is gone (the broker answered its unsubscribe)."""
        with self._lock:
            self._free.setdefault(topic, []).append(name)


NAMES = SubscriptionNames()
# A forked child (Spark's Python workers come from a fork server) must not share its parent's names, nor a
# lock some other thread of the parent held at the fork.
os.register_at_fork(after_in_child=NAMES.reset)

__all__ = ["NAMES", "PREFIX", "SubscriptionNames"]
