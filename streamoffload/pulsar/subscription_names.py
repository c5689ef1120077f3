"""Names for the readers' non-durable subscriptions: the same few names for every process and run.

Every micro-batch subscribes anew to each topic-partition it reads (and once more to ask its last
position). pulsar-lite records every subscription name it has ever seen on a topic in its metadata, even
after an unsubscribe, and a subscription under a name new to the topic costs it more the more it holds:
~16 ms of broker CPU at 10,000 topic-partitions, where a name the topic has seen before costs 0.06 ms
(bench/README, session 32). Real Pulsar forgets a non-durable subscription with its last consumer, so
reuse is harmless there.

So names are reused, within a process and across processes: a process claims a **slot** on its host (the
lowest free one; a lock on ``slot-<n>`` in a per-user directory, held while the process lives) and names its
subscriptions ``<prefix><host>-<slot>-<i>``, ``i`` the lowest index not open in this process on that topic.
The next process to take the slot (a restarted job, Spark's next Python worker) uses the same names, which
the broker has seen: a job's start over thousands of topic-partitions then costs the broker no new names.

A name is used by one open consumer at a time: a second Exclusive consumer under a name in use is refused
(pulsar-lite closes the whole connection), which the slot lock rules out between processes. A name goes
back to the process's free ones only after the broker confirmed its unsubscribe; otherwise it may still be
in use, and the process does not use it again. Where no slot can be claimed (an unwritable temporary
directory), the process names its subscriptions under a random prefix of its own, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
import threading
import uuid

PREFIX = "streamoffload-raw-"
MAX_SLOTS = 1024


SLOTS_DIR_ENV = "STREAMOFFLOAD_SUBSCRIPTION_SLOTS"


def default_slots_dir() -> str:
    """Where the slots' lock files are: ``$STREAMOFFLOAD_SUBSCRIPTION_SLOTS``, else a per-user directory in the
    temporary directory."""
    return os.environ.get(SLOTS_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"streamoffload-subscription-slots-{os.getuid()}"
    )


class SubscriptionNames:
    """Per topic, this process's names in use; a new name is the lowest index not in use."""

    def __init__(self, slots_dir: str | None = None) -> None:
        self.slots_dir = slots_dir
        self._slot_fd: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every name and the slot (a forked child must not use its parent's: the parent holds them)."""
        if self._slot_fd is not None:
            # The child's copy of the parent's locked descriptor: closing it leaves the parent's lock in place.
            with contextlib.suppress(OSError):
                os.close(self._slot_fd)
        self._slot_fd = None
        self._lock = threading.Lock()
        self._prefix: str | None = None
        self._in_use: dict[str, set[int]] = {}

    @property
    def prefix(self) -> str:
        """``<PREFIX><host>-<slot>``, claiming the slot at the first call."""
        with self._lock:
            return self._claimed()

    def _claimed(self) -> str:
        if self._prefix is None:
            self._prefix = self._claim()
        return self._prefix

    def _claim(self) -> str:
        host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:40] or "host"
        directory = self.slots_dir or default_slots_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if os.stat(directory).st_uid != os.getuid():
                raise PermissionError(f"{directory} belongs to another user")
            for slot in range(MAX_SLOTS):
                fd = os.open(os.path.join(directory, f"slot-{slot}"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._slot_fd = fd
                return f"{PREFIX}{host}-{slot}"
        except OSError:
            pass
        return f"{PREFIX}{uuid.uuid4().hex[:12]}"

    def take(self, topic: str) -> str:
        with self._lock:
            prefix = self._claimed()
            used = self._in_use.setdefault(topic, set())
            index = 0
            while index in used:
                index += 1
            used.add(index)
            return f"{prefix}-{index}"

    def give_back(self, topic: str, name: str) -> None:
        """``name``'s subscription on ``topic`` is gone (the broker answered its unsubscribe)."""
        with self._lock:
            prefix, _, index = name.rpartition("-")
            if prefix == self._prefix and index.isdigit():
                self._in_use.get(topic, set()).discard(int(index))


NAMES = SubscriptionNames()
# A forked child (Spark's Python workers come from a fork server) must not share its parent's names, nor a
# lock some other thread of the parent held at the fork.
os.register_at_fork(after_in_child=NAMES.reset)

__all__ = ["MAX_SLOTS", "NAMES", "PREFIX", "SLOTS_DIR_ENV", "SubscriptionNames", "default_slots_dir"]
