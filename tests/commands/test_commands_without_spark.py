"""The commands that only read or write the store start without pyspark: ``offload-now`` writes a small JSON
object and ``offload-status`` reads a few, so neither may pay for importing Spark (issue 27). Each command runs
in a fresh interpreter, which then says whether ``pyspark`` was imported. The import contract in pyproject.toml
keeps pyspark in the Spark adapters; this checks that none of them is reached on these commands' way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore

TOPIC = "persistent://public/default/orders-partition-0"

RUN = """
import json, sys
from streamoffload.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
sys.stderr.write("\\n" + json.dumps({"exit": code, "pyspark": "pyspark" in sys.modules}) + "\\n")
"""


def run_command(*args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A filesystem store that knows one topic-partition (offload-now refuses a topic nobody knows)."""
    root = tmp_path_factory.mktemp("store")
    MetadataStore(ScopedStore(FilesystemStore(root, fsync=False))).mark_ledger_deleted(TOPIC, 1, "test")
    return root


@pytest.mark.parametrize(
    "command",
    [
        "offload-now",
        "offload-status",
        "status",
        "read",
        "verify",
        "cleanup",
        "delete-ledger",
        "policy",
        "inspect",
        "table",
    ],
)
def test_help_does_not_import_pyspark(command: str) -> None:
    assert run_command(command, "--help") == {"exit": 0, "pyspark": False}


def test_offload_now_then_offload_status_do_not_import_pyspark(root: Path) -> None:
    assert run_command("offload-now", "--store", str(root), TOPIC) == {"exit": 0, "pyspark": False}
    assert run_command("offload-status", "--store", str(root), TOPIC) == {"exit": 0, "pyspark": False}


def test_status_read_and_verify_of_a_store_do_not_import_pyspark(root: Path) -> None:
    assert run_command("status", "--store", str(root)) == {"exit": 0, "pyspark": False}
    # Nothing is offloaded in this store: read and verify fail, naming why, without Spark either way.
    assert run_command("verify", "--store", str(root))["pyspark"] is False
    assert run_command("read", "--store", str(root), TOPIC)["pyspark"] is False


def test_the_check_sees_pyspark_when_a_command_imports_it() -> None:
    """The probe itself: ``run --help`` builds its parser only, but a run imports Spark; here, importing an
    adapter must show up."""
    code = "import sys; import streamoffload.streaming.source.pulsar_source; print('pyspark' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"
