"""Issue 13, plain Python: logging options anywhere on the command line, one-line Spark errors, block sizes that
hold the largest entry, one definition of lag shared by ``status`` and the metric, typos of ``offload-now``
refused. (The dashboard and alerts are in tests/dashboard, docker/ in tests/monitoring; ``produce`` against a
broker, the quiet Spark session and the demo in tests/e2e/test_operator_experience_e2e.py.)"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import BlockSizeError, OffloadPolicy, check_block_size, min_block_size
from streamoffload.cli import main, one_line, root_cause, split_logging_args
from streamoffload.cli_common import LogSettings, configure_logging, log_settings
from streamoffload.commands.status import render_table
from streamoffload.config import Config, check_config_block_sizes, parse_config
from streamoffload.errors import StreamOffloadError
from streamoffload.metrics.collector import JobMetrics
from streamoffload.metrics.model import Backlog
from streamoffload.status import offload_lag_seconds, store_status
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job import session
from streamoffload.streaming.segmenter.segmenter_model import MemoryState
from tests.fixtures.entries import memory_sink
from tests.metrics.test_metrics_unit import TOPIC, FakeClock, entries, run_batch, value

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def restore_logging() -> object:
    before = log_settings()
    yield
    configure_logging(before)


# --- logging options -----------------------------------------------------------------------------------------


def test_logging_options_are_taken_from_anywhere_up_to_a_double_dash() -> None:
    argv = ["status", "--store", "x", "--log-level", "INFO", "-q", "--log-file=/tmp/l", "--json", "--", "--quiet"]
    taken, rest = split_logging_args(argv)
    assert taken == ["--log-level", "INFO", "-q", "--log-file=/tmp/l"]
    assert rest == ["status", "--store", "x", "--json", "--", "--quiet"]
    assert split_logging_args(["--log-level", "debug", "demo"]) == (["--log-level", "debug"], ["demo"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "error", "--quiet", "dashboard", "export", "-o", "{out}"],
        ["dashboard", "export", "-o", "{out}", "--log-level", "ERROR", "--quiet"],
        ["dashboard", "--quiet", "export", "--log-level=ERROR", "-o", "{out}"],
    ],
)
def test_log_level_and_quiet_work_before_or_after_the_subcommand(argv: list[str], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert main([a.replace("{out}", str(out)) for a in argv]) == 0
    assert out.exists()
    settings = log_settings()
    assert settings.level == "ERROR" and settings.quiet
    # The level reaches Python's loggers, pulsar-client's logger and Spark's next session.
    assert logging.getLogger().getEffectiveLevel() == logging.ERROR
    assert logging.getLogger("streamoffload.pulsar").level == logging.ERROR
    assert session.spark_logging().level == "ERROR" and session.spark_logging().quiet


def test_a_bad_log_level_is_refused_wherever_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard", "export", "--log-level", "LOUD"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


def test_a_log_file_takes_every_line_and_the_terminal_only_errors(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "so.log"
    configure_logging(LogSettings(log_file=str(log_file)))
    log = logging.getLogger("streamoffload.test")
    log.info("an info line")
    log.warning("a warning line")
    text = log_file.read_text()
    assert "INFO streamoffload.test: an info line" in text and "a warning line" in text
    handlers = [h for h in logging.getLogger().handlers if getattr(h, "_streamoffload", False)]
    terminal = [h for h in handlers if not isinstance(h, logging.FileHandler)]
    assert [h.level for h in terminal] == [logging.ERROR]
    assert session.spark_logging().log_file == str(log_file)
    assert session.spark_logging().level == "WARN"  # Spark's INFO is pages per query: only when asked for


def test_spark_output_on_a_terminal_keeps_warnings_and_drops_the_noise() -> None:
    quiet, default = session.SparkLogging("WARN", None, True), session.SparkLogging("WARN", None, False)
    warn = "2026-11-23 19:21:22,410 WARN org.apache.spark.sql.X: something to act on\n"
    for noise in (
        "Streaming TransformWithStateInPandas Python worker Starting execution of UDF: <bound method ...>.\n",
        'Setting default log level to "WARN".\n',
        "\tat org.apache.spark.sql.execution.streaming.MicroBatchExecution.run(MicroBatchExecution.scala:1)\n",
        "java.lang.StackOverflowError\n",
    ):
        assert not session.terminal_line(noise, default), noise
    assert session.terminal_line(warn, default) and not session.terminal_line(warn, quiet)
    assert session.terminal_line("anything\n", session.SparkLogging("INFO", None, False))
    properties = session.log4j_properties(default)
    assert "rootLogger.level = warn" in properties and "logger.quiet0.level = error" in properties
    assert "logger.quiet0" not in session.log4j_properties(session.SparkLogging("INFO"))


# --- one-line errors from Spark ------------------------------------------------------------------------------

SPARK_FAILURE = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage \
failure: Task 0 in stage 3.0 failed 1 times, most recent failure: Lost task 0.0: \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/pyspark/worker.py", line 2020, in main
    process()
  File "/x/streamoffload/streaming/segmenter.py", line 356, in _add
    raise EntryTooLargeError(
streamoffload.codecs.errors.EntryTooLargeError: persistent://public/default/t: entry 2:1 of 368174 bytes does not \
fit in a block of managedLedgerOffloadMaxBlockSizeInBytes = 262144 (needs 368314); raise it and restart

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
\tat org.apache.spark.sql.execution.python.PythonArrowOutput$$anon$1.read(PythonArrowOutput.scala:118)
Caused by: java.lang.RuntimeException: not this one
\t... 30 more
"""


def test_root_cause_names_the_python_exception_of_a_spark_failure() -> None:
    cause = root_cause(SPARK_FAILURE)
    assert cause.startswith("EntryTooLargeError: persistent://public/default/t: entry 2:1 of 368174 bytes")
    assert "\n" not in cause and "\tat " not in cause
    # Without a Python traceback: the last Java cause; without either: the first line.
    assert root_cause("boom\n\tat a.b(C.java:1)\nCaused by: java.io.IOException: disk full\n") == (
        "IOException: disk full"
    )
    assert root_cause("\n  only this line\n") == "only this line"
    assert one_line(StreamOffloadError(f"offload query failed: {SPARK_FAILURE}")).startswith(
        "offload query failed: EntryTooLargeError: persistent://public/default/t: entry 2:1"
    )
    assert one_line(StreamOffloadError("one line already")) == "one line already"


def test_a_failing_command_with_a_spark_error_prints_one_line_and_logs_the_rest(tmp_path: Path) -> None:
    log_file = tmp_path / "so.log"
    code = f"""
import sys
from pyspark.errors.exceptions.captured import StreamingQueryException
import streamoffload.commands.status as status
def fail(args):
    err = StreamingQueryException.__new__(StreamingQueryException)  # as Spark raises it, without a JVM here
    err._desc, err._stackTrace = {SPARK_FAILURE!r}, "\\tat org.apache.X.y(X.java:1)"
    err._cause = err._origin = None
    raise err
status.run = fail
from streamoffload.cli import main
sys.exit(main(["status", "--store", "/nowhere", "--log-file", {str(log_file)!r}]))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamoffload status: error: EntryTooLargeError: persistent://public/default/t")
    assert lines[0].endswith(f"(details in {log_file})")
    assert "PythonRunner.scala" in log_file.read_text()


# --- block size vs the largest entry -------------------------------------------------------------------------


def test_a_block_smaller_than_the_largest_entry_is_refused_with_the_reason() -> None:
    needed = min_block_size()
    assert needed == 128 + 12 + 5 * 1024 * 1024 + 1024
    with pytest.raises(BlockSizeError, match=r"= 262144 cannot hold the largest entry the broker accepts \(maxMessage"):
        check_block_size(262144)
    check_block_size(needed)
    check_block_size(OffloadPolicy().managedLedgerOffloadMaxBlockSizeInBytes)  # the 64 MiB default
    check_block_size(300_000, max_message_size=256 * 1024)  # a broker configured for smaller messages


def test_every_policy_of_a_configuration_is_checked_when_it_is_loaded(tmp_path: Path) -> None:
    doc = {
        "pulsar": {"topics": ["persistent://public/default/a"]},
        "offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 8 * 1024 * 1024},
        "namespaces": {"acme/small": {"managedLedgerOffloadMaxBlockSizeInBytes": 1024 * 1024}},
    }
    with pytest.raises(BlockSizeError, match=r"c\.toml: managedLedgerOffloadMaxBlockSizeInBytes = 1048576"):
        parse_config(doc, str(tmp_path / "c.toml"), tmp_path)
    # A broker configured for messages of at most 512 KiB lets 1 MiB blocks through.
    small = {**doc, "pulsar": {**doc["pulsar"], "max_message_size": "512KiB"}}
    config = parse_config(small, str(tmp_path / "c.toml"), tmp_path)
    assert config.pulsar.max_message_size == 512 * 1024
    check_config_block_sizes(config, config.pulsar.max_message_size)
    check_config_block_sizes(Config())
    with pytest.raises(StreamOffloadError, match=r"pulsar\.max_message_size must be"):
        parse_config({"pulsar": {"max_message_size": 3 << 30}})


# --- one lag ---------------------------------------------------------------------------------------------------


def test_status_lag_is_the_metric_lag(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    meta = MetadataStore(ScopedStore(store))
    run_batch(
        memory_sink(ScopedStore(store)), MemoryState(), entries(3, 60, publish_base=5_000_000), now_ms=1, seal_all=True
    )
    now_ms = 5_000_000 + 100_000
    latest: dict[str, Backlog] = {}
    metrics = JobMetrics(meta, backlog=lambda topics: dict(latest), clock=FakeClock(now_ms / 1000))
    metrics.refresh_store()

    def both(position: tuple[int, int] | None, known: bool) -> tuple[float | None, float | None, str]:
        latest.clear()
        if known:
            latest[TOPIC] = Backlog(latest=position)
        metrics.refresh_backlog()
        [row] = store_status(meta, now_ms, {TOPIC: position} if known else None)
        return row.lag_seconds, value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC), render_table([row])

    status_lag, metric_lag, table = both((3, 59), known=True)  # everything offloaded
    assert status_lag == metric_lag == 0.0 and "caught up" in table
    status_lag, metric_lag, table = both((3, 75), known=True)  # 16 entries published since
    assert status_lag == metric_lag == pytest.approx(100 - 0.059) and table.endswith(" 100s")
    status_lag, metric_lag, table = both(None, known=False)  # no broker asked: the same figure, marked unknown
    assert status_lag == pytest.approx(100 - 0.059) and table.endswith(" 100s?")
    assert offload_lag_seconds(True, 0, now_ms) == 0.0 and offload_lag_seconds(None, 0, now_ms) is None


# --- offload-now refuses typos ---------------------------------------------------------------------------------


def test_offload_now_refuses_a_topic_neither_stored_nor_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    run_batch(
        memory_sink(ScopedStore(store)), MemoryState(), entries(3, 5, publish_base=1_000), now_ms=1, seal_all=True
    )
    url = str(tmp_path / "store")
    code = main(["offload-now", "--store", url, "persistent://public/default/nonexistent-topic"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.count("\n") == 0
    assert err.startswith("streamoffload offload-now: error: unknown topic 'persistent://public/default/nonexist")
    assert list((tmp_path / "store").rglob("*request*")) == []  # nothing was requested
    # The stored topic (by its partitioned name, too) and a configured one are accepted.
    assert main(["offload-now", "--store", url, TOPIC.removesuffix("-partition-0")]) == 0
    conf = tmp_path / "c.toml"
    conf.write_text(f'[pulsar]\ntopics = ["fresh"]\n[store]\nroot = "{url}"\n')
    assert main(["offload-now", "--conf", str(conf), "fresh"]) == 0
    assert "requested offload of persistent://public/default/fresh" in capsys.readouterr().out
    assert main(["offload-now", "--store", str(tmp_path / "missing"), TOPIC]) == 1


def test_py4j_tracebacks_stay_off_the_terminal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    configure_logging(LogSettings())
    logging.getLogger("py4j.clientserver").error("There was an exception while executing the Python Proxy")
    logging.getLogger("streamoffload.x").error("a real error")
    err = capsys.readouterr().err
    assert "Python Proxy" not in err and "a real error" in err
    log_file = tmp_path / "so.log"
    configure_logging(LogSettings(log_file=str(log_file)))
    logging.getLogger("py4j.clientserver").error("There was an exception while executing the Python Proxy")
    assert "Python Proxy" in log_file.read_text() and "Python Proxy" not in capsys.readouterr().err


# --- help texts ----------------------------------------------------------------------------------------------


def _all_parsers() -> dict[str, object]:
    """Every parser of the command line by its command (``""`` for the top level), subcommands included."""
    import argparse

    from streamoffload.cli import build_parser

    found: dict[str, object] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(f"{name} {sub}".strip(), child)

    walk("", build_parser())
    return found


def test_every_help_text_has_a_description_and_an_example() -> None:
    """The README promises `--help` with examples for every command: a newcomer learns from them."""
    lacking = []
    for name, parser in _all_parsers().items():
        text = parser.format_help()  # type: ignore[attr-defined]
        described = bool((parser.description or "").strip())  # type: ignore[attr-defined]
        shows = f"streamoffload {name}".strip() + " " in text.replace("\n", " ")
        if not (described and "example" in text and shows):
            lacking.append(name or "(top level)")
    assert not lacking, f"--help without a description or an example: {lacking}"


def test_the_demo_suggests_commands_the_user_can_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """scripts/demo.sh does not activate the venv, so `streamoffload ...` alone would be 'command not found'."""
    from streamoffload.commands import demo

    script = tmp_path / ".venv" / "bin" / "streamoffload"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert demo._program() == ".venv/bin/streamoffload"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert demo._program() == "streamoffload"


def test_the_readme_lists_every_command() -> None:
    """README's command table is where a newcomer finds what exists; a new command must appear there."""
    import re

    listed = set(re.findall(r"^\| `([a-z-]+)", (REPO / "README.md").read_text(), flags=re.M))
    listed |= set(re.findall(r"^\| `produce`, `([a-z-]+)`", (REPO / "README.md").read_text(), flags=re.M))
    commands = {name.split()[0] for name in _all_parsers() if name}
    assert commands - listed == set()
