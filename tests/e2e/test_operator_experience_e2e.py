"""Issue 13 end to end, with the real pulsar-lite broker and a real Spark JVM, each in its own process (the
terminal output is what is tested): ``produce --json`` writes JSON only to stdout, the client's INFO lines go to
the log; a Spark session started by streamoffload shows no banner and no Python-worker chatter, and with a log
file everything the JVM says lands there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streamoffload.embedded_broker import EmbeddedBroker
from tests.fixtures.broker import unique_topic

REPO = Path(__file__).resolve().parents[2]


def cli(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamoffload", *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_produce_json_is_clean_on_stdout_and_client_logs_go_to_the_log(
    pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = unique_topic("opx")
    argv = ["produce", "--service-url", pulsar_broker.service_url, "--topic", topic, "--count", "50", "--json"]
    result = cli(*argv, "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # all of stdout is the one JSON document (what `| jq` needs)
    assert summary["messages"] == 50
    assert "INFO" not in result.stderr, result.stderr  # WARNING by default: the client's INFO lines are not shown

    # With INFO asked for (after the subcommand), the client's lines come through Python's logging on stderr ...
    log_file = tmp_path / "so.log"
    verbose = cli(*argv, "--log-level", "INFO", "--no-progress")
    assert verbose.returncode == 0 and json.loads(verbose.stdout)["messages"] == 50
    assert "INFO streamoffload.pulsar:" in verbose.stderr
    # ... or into a log file, the terminal staying quiet.
    logged = cli(*argv, "--log-file", str(log_file), "--log-level", "INFO", "--no-progress")
    assert logged.returncode == 0 and json.loads(logged.stdout)["messages"] == 50 and logged.stderr == ""
    assert "INFO streamoffload.pulsar:" in log_file.read_text()


SPARK_SCRIPT = """
import sys
from streamoffload.cli_common import LogSettings, configure_logging
from streamoffload.streaming.job.session import build_session
log_file = sys.argv[1] or None
configure_logging(LogSettings(log_file=log_file))
spark = build_session(master="local[1]", work_dir=sys.argv[2])
df = spark.createDataFrame([(1,), (2,)], ["x"])
print("rows", df.count(), flush=True)
spark.stop()
"""


def test_a_spark_session_is_quiet_on_the_terminal_and_complete_in_the_log_file(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    log_file = tmp_path / "logs" / "spark.log"
    result = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT, str(log_file), str(tmp_path / "w")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "rows 2"
    assert result.stderr == "", result.stderr  # no banner, no WARN lines, no Java frames
    # (Without a log file the terminal gets Spark's WARN/ERROR records only: test_operator_experience.py.)
    text = log_file.read_text()
    assert "WARNING: Using incubator modules" in text or "log level" in text, text[:2000]  # the JVM's output
