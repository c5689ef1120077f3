"""The sink tasks' progress files: a span per topic-partition and task, rewritten at most every ``every_s`` and at
the end; a span written again counted once; files being written (temporary names) or broken are not read."""

from __future__ import annotations

import json
from pathlib import Path

from streamoffload.streaming.runtime.progress_files import TaskProgress, WrittenSpan, read_spans, task_file, written


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_touching_parts_join_and_the_file_is_rewritten_at_most_every_interval(tmp_path: Path) -> None:
    clock = Clock()
    path = task_file(str(tmp_path), 3, 1, 0)
    assert Path(path).name == "00000003-00001-0.json"
    progress = TaskProgress(path, every_s=0.5, clock=clock)
    progress.wrote("t", (5, 9), (5, 19), 10, 1000)  # the first part: written at once
    assert read_spans(str(tmp_path)) == {"t": [WrittenSpan((5, 9), (5, 19), 10, 1000)]}
    clock.now += 0.1
    progress.wrote("t", (5, 19), (6, 4), 15, 1500)  # touches the first: one span; not written yet (0.1 s later)
    progress.wrote("u", (-1, -1), (0, 0), 1, 7)
    assert read_spans(str(tmp_path)) == {"t": [WrittenSpan((5, 9), (5, 19), 10, 1000)]}
    clock.now += 0.4
    progress.wrote("t", (6, 9), (6, 10), 1, 100)  # a gap (a part a replay skipped): a span of its own
    assert read_spans(str(tmp_path)) == {
        "t": [WrittenSpan((5, 9), (6, 4), 25, 2500), WrittenSpan((6, 9), (6, 10), 1, 100)],
        "u": [WrittenSpan((-1, -1), (0, 0), 1, 7)],
    }
    assert written(read_spans(str(tmp_path))["t"]) == (26, 2600)


def test_flush_writes_what_the_interval_held_back(tmp_path: Path) -> None:
    clock = Clock()
    progress = TaskProgress(task_file(str(tmp_path), 0, 0, 0), clock=clock)
    progress.wrote("t", (1, 0), (1, 5), 5, 50)
    progress.wrote("t", (1, 5), (1, 9), 4, 40)
    assert written(read_spans(str(tmp_path))["t"]) == (5, 50)
    progress.flush()
    assert written(read_spans(str(tmp_path))["t"]) == (9, 90)


def test_a_span_written_again_counts_once_and_the_longer_wins() -> None:
    # A retried task writes a small segment whole again (same start), another attempt got further from there.
    spans = [
        WrittenSpan((1, 0), (1, 9), 9, 90),
        WrittenSpan((1, 0), (1, 9), 9, 90),
        WrittenSpan((1, 0), (1, 19), 19, 190),
        WrittenSpan((1, 19), (1, 29), 10, 100),
    ]
    assert written(spans) == (29, 290)


def test_temporary_broken_and_missing_files_are_not_read(tmp_path: Path) -> None:
    assert read_spans(str(tmp_path / "absent")) == {}
    (tmp_path / ".progress-x.json").write_text(json.dumps({"t": [[1, 0, 1, 9, 9, 90]]}))
    (tmp_path / "00000000-00000-0.json").write_text('{"t": [[1, 0')
    (tmp_path / "00000000-00001-0.json").write_text(json.dumps({"t": [[2, 0, 2, 4, 4, 40]]}))
    assert read_spans(str(tmp_path)) == {"t": [WrittenSpan((2, 0), (2, 4), 4, 40)]}
