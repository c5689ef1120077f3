"""The README's first command, ``bash scripts/demo.sh``, three times in a row: each run passes, and its
terminal output is the story only (no client INFO line, no Java stack frame, no Spark banner); README's samples
of what the demo prints (its job's progress lines and the status table) and of ``verify --crc`` on its store are
what they print, but for the figures that vary (counts, sizes, times) and the store's path.

Slow (about 1.5 minutes a run on two cores), so opt-in: ``STREAMOFFLOAD_DEMO_TEST=1``. It runs the script of
this checkout with its virtual environment (``STREAMOFFLOAD_VENV`` as the script reads it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS = 3

slow_demo = pytest.mark.skipif(
    os.environ.get("STREAMOFFLOAD_DEMO_TEST") != "1", reason="slow: set STREAMOFFLOAD_DEMO_TEST=1 to run the demo"
)

NOISE = (
    re.compile(r"\bINFO\b"),  # pulsar-client's (or anyone's) INFO lines
    re.compile(r"^\s*at [\w.$]+\(.*\)$", re.M),  # Java stack frames
    re.compile(r"^Caused by: ", re.M),
    re.compile(r"Setting default log level|Using Spark's default log4j profile"),  # the Spark banner
    re.compile(r"TransformWithStateInPandas Python worker"),
    re.compile(r"Traceback \(most recent call last\)"),
)


def readme_sample(first_line: str) -> list[str]:
    """The lines of README's sample block (a bare code fence) whose first line starts with ``first_line``."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    fenced = False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            current = [] if fenced and line == "```" else None
            if current is not None:
                blocks.append(current)
        elif fenced and current is not None:
            current.append(line)
    found = [block for block in blocks if block and block[0].startswith(first_line)]
    assert len(found) == 1, f"README has {len(found)} sample blocks starting {first_line!r}"
    return found[0]


SIZE = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)")
"""A size as the status table prints it: its unit varies with the figure."""


def sample_pattern(line: str) -> re.Pattern[str]:
    """A README sample line as a pattern: its words exact, any figure (a run of digits, a size in any unit) and a
    store URL free, and any run of spaces one or more (a table's columns widen with its figures)."""
    out = []
    for piece in re.split(rf"(file://\S+|{SIZE.pattern}|\d+| +)", line):
        if piece.startswith("file://"):
            out.append(r"file://\S+")
        elif SIZE.fullmatch(piece):
            out.append(SIZE.pattern)
        elif piece.isdigit():
            out.append(r"\d+")
        elif piece and not piece.strip():
            out.append(" +")
        else:
            out.append(re.escape(piece))
    return re.compile("^" + "".join(out) + "$")


def assert_sample_printed(sample: list[str], output: str) -> None:
    """Each of ``sample``'s lines matches a line of ``output``, in order; blank lines match blank lines."""
    lines = output.splitlines()
    at = 0
    for line in sample:
        pattern = sample_pattern(line)
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        assert at < len(lines), f"README's sample line {line!r} is not in what was printed:\n{output}"
        at += 1


def test_readme_samples_are_read_as_patterns() -> None:
    demo = readme_sample("== running the offload job")
    assert any(line.startswith("TOPIC-PARTITION ") for line in demo)
    status = next(line for line in demo if line.startswith("persistent://public/default/demo-audit "))
    assert sample_pattern(status).match(status.replace("3000", "500").replace("898.5 KiB", "1.2 MiB"))
    assert not sample_pattern(status).match(status.replace("caught up", "11s?"))
    verify = readme_sample("$ .venv/bin/streamoffload verify --store var/demo/store --crc")
    assert verify[-1].startswith("verified ") and verify[-1].endswith(": OK")


@slow_demo
def test_the_demo_passes_three_times_in_a_row_with_a_clean_terminal(tmp_path: Path) -> None:
    for run in range(RUNS):
        work = tmp_path / f"demo-{run}"
        result = subprocess.run(
            ["bash", "scripts/demo.sh", "--messages", "500", "--work-dir", str(work)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "STREAMOFFLOAD_VENV": str(REPO / ".venv")},
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"run {run + 1}: exit {result.returncode}\n{output}"
        for pattern in NOISE:
            assert not pattern.search(output), f"run {run + 1}: {pattern.pattern!r} on the terminal:\n{output}"
        assert output.count("messages read back, all identical") == 4, output
        assert "micro-batch 0:" in output and "caught up" in output
        log_file = work / "logs" / "demo.log"
        assert f"logs: {log_file}" in result.stdout and log_file.stat().st_size > 0
        if run == 0:
            assert_sample_printed(readme_sample("== running the offload job"), result.stdout)
            _command, *verify_sample = readme_sample("$ .venv/bin/streamoffload verify --store var/demo/store --crc")
            verify = subprocess.run(
                [sys.executable, "-m", "streamoffload", "verify", "--store", str(work / "store"), "--crc"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert verify.returncode == 0, verify.stderr
            assert_sample_printed(verify_sample, verify.stdout)
