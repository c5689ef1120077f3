"""The README's first command, ``bash scripts/demo.sh``, three times in a row: each run passes, and its
terminal output is the story only (no client INFO line, no Java stack frame, no Spark banner).

Slow (about 1.5 minutes a run on two cores), so opt-in: ``STREAMOFFLOAD_DEMO_TEST=1``. It runs the script of
this checkout with its virtual environment (``STREAMOFFLOAD_VENV`` as the script reads it)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS = 3

pytestmark = pytest.mark.skipif(
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
