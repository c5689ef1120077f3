"""``bench/procstats``: CPU seconds by process group, over a process table (pure: the table is given)."""

from __future__ import annotations

import os

import pytest

from bench import procstats


def test_a_broker_that_is_a_jvm_counts_as_the_broker_not_as_sparks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apache Pulsar standalone is a JVM the bench starts, beside Spark's: its CPU is the broker's alone."""
    me = os.getpid()
    table = {  # pid: (ppid, comm, own CPU s, reaped children's CPU s)
        me: (1, "python", 1.0, 0.0),
        10: (me, "java", 5.0, 2.0),  # Spark's JVM (its exited Python workers: 2.0)
        11: (10, "python3", 3.0, 0.0),  # a live Python worker of it
        20: (me, "java", 7.0, 0.5),  # Apache Pulsar standalone
        21: (20, "java", 1.0, 0.0),  # a process of the broker's
    }
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    monkeypatch.setattr(procstats, "_process_table", lambda: (table, children))
    monkeypatch.setattr(procstats, "is_fork_server", lambda pid: False)
    assert procstats.cpu_by_group(20) == {"broker": 8.5, "jvm": 5.0, "python workers": 5.0, "driver": 1.0}
    # pulsar-lite: a broker that is not a JVM; nothing else changes
    del table[21]
    table[20] = (me, "pulsar-lite", 7.0, 0.5)
    children[20] = []
    assert procstats.cpu_by_group(20) == {"broker": 7.5, "jvm": 5.0, "python workers": 5.0, "driver": 1.0}
