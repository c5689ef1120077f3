"""Control characters read from a store (a topic name, a failure reason) or given on the command line reach the
terminal escaped, never as themselves: the status table, error lines and log lines on the terminal
(``streamoffload.printable``). JSON output keeps its own escaping."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamoffload.cli import main
from streamoffload.cli_common import LogSettings, configure_logging, log_settings
from streamoffload.printable import PrintableWriter, printable
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.quarantine import Quarantine
from tests.commands.test_cli_errors import one_error_line

HOSTILE_TOPIC = "persistent://public/default/evil\x1b[2J\rname"
SHOWN_TOPIC = "persistent://public/default/evil\\x1b[2J\\rname"
HOSTILE_REASON = "boom\x1b]0;pwned\x07 \u202egnp.exe\nforged line"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    before = log_settings()
    yield
    configure_logging(before)


def test_printable_escapes_controls_and_only_them() -> None:
    assert printable("a\x1b[2Jb\rc\nd\u202ee\tf\x00g\x7fh\x9bi") == "a\\x1b[2Jb\\rc\\nd\\u202ee\\tf\\x00g\\x7fh\\x9bi"
    assert printable("persistent://public/default/zürich-€ ok") == "persistent://public/default/zürich-€ ok"
    assert printable("line 1\nline\x1b 2", keep_newlines=True) == "line 1\nline\\x1b 2"
    out = io.StringIO()
    PrintableWriter(out).write("key \x1b[31mred\n")
    assert out.getvalue() == "key \\x1b[31mred\n"


def test_the_status_table_escapes_what_the_store_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    Quarantine(ScopedStore(FilesystemStore(root, fsync=False))).note_failure(HOSTILE_TOPIC, HOSTILE_REASON, now_ms=1)
    assert main(["status", "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"{'TOPIC-PARTITION':<56} {'OFFLOADED':>9} {'OPEN':>4} {'FAILED':>6} {'ENTRIES':>10} {'BYTES':>10} "
        f"{'LAST POSITION':>16} {'LAG':>9}",
        f"{SHOWN_TOPIC:<56} {0:>9} {0:>4} {0:>6} {0:>10} {'0 B':>10} {'-':>16} {'-':>9}",
        "    failing (1 in a row): boom\\x1b]0;pwned\\x07 \\u202egnp.exe\\nforged line",
    ]
    # --json: JSON's own escapes, the values as they are.
    assert main(["status", "--store", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(t["topic"], t["set_aside"]["reason"]) for t in doc["topics"]] == [(HOSTILE_TOPIC, HOSTILE_REASON)]


def test_an_error_line_escapes_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no\x1b[2Jstore"
    assert main(["status", "--store", str(missing)]) == 1
    line = one_error_line(capsys.readouterr().err, "status")
    assert line == f"streamoffload status: error: no store at {tmp_path}/no\\x1b[2Jstore: the directory does not exist"


def test_log_lines_on_the_terminal_escape_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(LogSettings())
    logging.getLogger("streamoffload.test").warning("topic %s set aside", HOSTILE_TOPIC)
    assert (
        capsys.readouterr().err.splitlines()[-1].endswith(f"WARNING streamoffload.test: topic {SHOWN_TOPIC} set aside")
    )
