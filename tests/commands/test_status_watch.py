"""`streamoffload status --watch`: the live terminal view."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.cli import main
from streamoffload.commands import status as status_cmd
from streamoffload.commands.status import CLEAR, watch
from streamoffload.status import TopicStatus
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from tests.fixtures.entries import Published, holding, memory_sink, metas

TOPIC = "persistent://public/default/watch-partition-0"


class Ticks:
    """A clock advanced by the fake sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def rows_with(entries: int) -> list[TopicStatus]:
    return [TopicStatus(topic=TOPIC, segments={"Offloaded": 1}, entries=entries, data_bytes=2048)]


def test_frames_clear_the_screen_and_show_rates_between_refreshes() -> None:
    counts = iter([100, 150, 150])
    ticks, out = Ticks(), io.StringIO()
    code = watch(
        lambda: rows_with(next(counts)),
        2.0,
        "file:///store",
        out=out,
        clear=True,
        iterations=3,
        sleep=ticks.sleep,
        clock=ticks.clock,
    )
    assert code == 0
    frames = out.getvalue().split(CLEAR)[1:]
    assert len(frames) == 3
    assert ticks.slept == [2.0, 2.0]
    assert "ENTRIES/S" in frames[0] and "every 2s, Ctrl-C to quit" in frames[0]
    row = lambda frame: next(line for line in frame.splitlines() if line.startswith(TOPIC))  # noqa: E731
    assert row(frames[0]).split()[-1] == "-"  # no rate before a second look
    assert row(frames[1]).split()[-1] == "25.0"  # 50 entries in 2 s
    assert row(frames[2]).split()[-1] == "0.0"
    assert "1 topic-partitions, 150 entries offloaded" in frames[2]


def test_ctrl_c_exits_0_and_a_store_error_keeps_the_view_alive() -> None:
    calls = {"n": 0}

    def fetch() -> list[TopicStatus]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("store unreachable")
        return rows_with(7)

    def sleep(_seconds: float) -> None:
        if calls["n"] >= 2:
            raise KeyboardInterrupt

    out = io.StringIO()
    assert watch(fetch, 1.0, "s3://bucket", out=out, clear=False, sleep=sleep) == 0
    text = out.getvalue()
    assert "error reading the store: OSError: store unreachable" in text
    assert TOPIC in text and CLEAR not in text  # not a terminal: frames are appended, not cleared


def test_json_lines_mode() -> None:
    out = io.StringIO()
    ticks = Ticks()
    watch(lambda: rows_with(3), 0.5, "file:///s", out=out, as_json=True, iterations=2, sleep=ticks.sleep)
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(docs) == 2
    assert docs[0]["store"] == "file:///s" and docs[0]["topics"][0]["entries"] == 3


def test_status_watch_command_on_a_real_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096, offloadBufferMaxBytes=1 << 20)
    entries = [Published(1, i, b"x" * 50, 1_000 + i) for i in range(12)]
    actions = run_segmenter(TOPIC, policy, MemoryState(), metas(entries), [CONTROL_SEAL], now_ms=5)
    sink = memory_sink(ScopedStore(store), fetcher=holding(TOPIC, entries))
    sink.apply(actions)

    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(status_cmd, "_sleep", interrupt)
    assert main(["status", "--store", str(tmp_path / "store"), "--watch", "0.5"]) == 0
    out = capsys.readouterr().out
    assert TOPIC in out and "12 entries offloaded" in out and "every 0.5s" in out

    assert main(["status", "--store", str(tmp_path / "store"), "--watch", "0"]) == 1
    assert "must be positive" in capsys.readouterr().err
