"""The command line refuses bad values and wrong targets with one clear line, and never leaves a traceback.

Plain Python: a real filesystem store filled by the segmenter and sink (``tests.read.offload``), the CLI run
in-process (``main``) or, where the process itself matters (tracebacks, a closed stdout), as a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import EXIT_BROKEN_PIPE, main
from streamoffload.errors import ConfigError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore, StoreNotFoundError, open_store
from tests.read import TOPIC, offload, pulsar_entries

REPO = Path(__file__).resolve().parents[2]
LEDGERS = {3: 30, 4: 25, 8: 20}  # ledger 8 is the newest offloaded ledger


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    offload(ScopedStore(FilesystemStore(path, fsync=False)), pulsar_entries(LEDGERS, seed=9), switch_at=40)
    return path


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamoffload", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error_line(stderr: str, command: str) -> str:
    """The single line the CLI printed for an error (no traceback, nothing else)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"streamoffload {command}: error: "), lines[0]
    return lines[0]


# --- the four tracebacks of the issue --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["delete-ledger", "--store", "{root}", TOPIC, "--", "-5"], "LEDGER_ID -5: ledger ids are integers"),
        (["read", "--store", "{root}", TOPIC, "--cache-bytes", "-1"], "--cache-bytes -1"),
        (["cleanup", "--store", "{root}", "--grace-minutes", "nan"], "--grace-minutes nan"),
        (["cleanup", "--store", "{root}", "--grace-minutes", "inf"], "--grace-minutes inf"),
        (["status", "--store", "{root}", "--watch", "nan"], "--watch nan"),
    ],
)
def test_bad_values_are_one_line_and_a_non_zero_exit(root: Path, argv: list[str], needle: str) -> None:
    result = run_cli(*(a.format(root=root) for a in argv))
    assert result.returncode == 1
    assert needle in one_error_line(result.stderr, argv[0])
    assert result.stdout == ""


def test_a_corrupt_first_entry_id_is_a_problem_not_a_traceback(root: Path) -> None:
    store = FilesystemStore(root, fsync=False)
    key = next(iter(store.list(f"public/default/{TOPIC.rsplit('/', 1)[1]}/_meta/segments/"))).key
    manifest = mf.decode_manifest(store.get(key))
    prop = next(p for info in manifest.ledgers for p in info.properties if p.key == "firstEntryId")
    prop.value = "not-a-number"
    store.put(key, mf.encode_manifest(manifest))
    result = run_cli("verify", "--store", str(root))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and result.stderr == ""
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1
    assert key in problems[0] and "CorruptManifest" in problems[0] and "'not-a-number'" in problems[0]


# --- a closed standard output ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["status", "--json"], ["verify", "--json"], ["read", TOPIC], ["status", "--json", "--watch", "0.05"]],
    ids=["status", "verify", "read", "status-watch"],
)
def test_a_reader_that_went_away_is_a_quiet_exit(root: Path, argv: list[str]) -> None:
    """`... | head`: the reader closed the pipe; the command stops at its first write, without a traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that has already gone: every write fails with EPIPE, deterministically
    try:
        result = subprocess.run(
            [sys.executable, "-m", "streamoffload", argv[0], "--store", str(root), *argv[1:]],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE


# --- wrong targets: refused, not created ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--json"],
        ["verify"],
        ["verify", TOPIC],
        ["read", TOPIC],
        ["delete-ledger", TOPIC, "3"],
        ["cleanup"],
        ["offload-now", TOPIC],
        ["offload-status", TOPIC],
        ["offload-status", TOPIC, "--wait", "--timeout", "1"],
    ],
)
def test_a_missing_store_directory_is_refused_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    missing = tmp_path / "typo" / "store"
    assert main([argv[0], "--store", str(missing), *argv[1:]]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err, argv[0]).endswith(f"no store at {missing}: the directory does not exist")
    assert not (tmp_path / "typo").exists()


def test_a_missing_store_in_a_configuration_file_is_refused_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "so.toml"
    conf.write_text('[store]\nroot = "nowhere"\n')
    assert main(["status", "--conf", str(conf)]) == 1
    assert "no store at" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def test_a_file_where_the_store_should_be_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["status", "--store", str(tmp_path / "file")]) == 1
    assert f"no store at {tmp_path / 'file'}: not a directory" in capsys.readouterr().err


def test_an_empty_existing_store_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["status", "--store", str(tmp_path / "empty")]) == 0
    assert "no offloaded topics" in capsys.readouterr().out


def test_open_store_without_create(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match=r"no store at .*: the directory does not exist") as err:
        open_store(str(tmp_path / "a" / "b"), create=False)
    assert isinstance(err.value, ConfigError)
    with pytest.raises(StoreNotFoundError):
        open_store((tmp_path / "a").as_uri(), create=False)
    assert not (tmp_path / "a").exists()
    # The default still creates (the job's store), and an existing directory opens either way.
    open_store(str(tmp_path / "a"), fsync=False).close()
    assert (tmp_path / "a").is_dir()
    open_store(str(tmp_path / "a"), create=False, fsync=False).close()


def test_delete_ledger_refuses_a_topic_the_store_does_not_hold(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for typo, hint in (("persistent://public/default/ordres-partition-0", TOPIC), ("orders", TOPIC)):
        assert main(["delete-ledger", "--store", str(root), typo, "3"]) == 1
        line = one_error_line(capsys.readouterr().err, "delete-ledger")
        assert "has no offloaded segments" in line and f"did you mean {hint}" in line
    assert sorted(p.name for p in (root / "public" / "default").iterdir()) == ["orders-partition-0"]


def test_delete_ledger_refuses_a_ledger_the_topic_does_not_hold(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = MetadataStore(ScopedStore(FilesystemStore(root, fsync=False)))
    assert main(["delete-ledger", "--store", str(root), TOPIC, "3", "5"]) == 1
    line = one_error_line(capsys.readouterr().err, "delete-ledger")
    assert "no offloaded ledger 5" in line and "3-4, 8" in line
    assert meta.deleted_ledgers(TOPIC) == {}  # nothing marked, not even ledger 3


def test_delete_ledger_refuses_the_newest_ledger_unless_forced(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = MetadataStore(ScopedStore(FilesystemStore(root, fsync=False)))
    assert main(["delete-ledger", "--store", str(root), TOPIC, "4", "8"]) == 1
    line = one_error_line(capsys.readouterr().err, "delete-ledger")
    assert "ledger 8 is the newest offloaded ledger" in line and "open at the broker" in line and "--force" in line
    assert meta.deleted_ledgers(TOPIC) == {}
    # An older ledger is fine, and running it again too.
    assert main(["delete-ledger", "--store", str(root), TOPIC, "3"]) == 0
    assert main(["delete-ledger", "--store", str(root), TOPIC, "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ledger 3: marked deleted", "ledger 3: already marked deleted"]
    assert main(["delete-ledger", "--store", str(root), TOPIC, "8", "--force"]) == 0
    assert "ledger 8: marked deleted" in capsys.readouterr().out
    assert sorted(meta.deleted_ledgers(TOPIC)) == [3, 8]


def test_cleanup_refuses_a_topic_the_store_does_not_hold(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cleanup", "--store", str(root), "--topic", "typo"]) == 1
    assert "holds no objects of this topic-partition" in one_error_line(capsys.readouterr().err, "cleanup")
    assert main(["cleanup", "--store", str(root), "--topic", TOPIC, "--grace-minutes", "0"]) == 0
    assert "1 topic-partition(s)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["read", "verify", "delete-ledger", "cleanup"])
def test_a_topic_argument_the_store_cannot_hold_is_one_line(
    root: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """43 x "é" is 258 bytes as a directory name: said so, instead of a store error about a file name."""
    topic = "é" * 43
    argv = {"delete-ledger": [topic, "3"], "cleanup": ["--topic", topic]}.get(command, [topic])
    assert main([command, "--store", str(root), *argv]) == 1
    line = one_error_line(capsys.readouterr().err, command)
    assert "258 bytes once encoded" in line and "255 a directory name can hold" in line


def test_topics_on_the_command_line_must_fit_the_store(tmp_path: Path) -> None:
    from streamoffload.cli import build_parser
    from streamoffload.cli_common import config_from_args

    args = build_parser().parse_args(["run", "--store", f"s3://bucket/{'p' * 930}", "--topics", "ok"])
    with pytest.raises(ConfigError, match="more than the 1024 S3 allows"):
        config_from_args(args)
    args = build_parser().parse_args(["run", "--store", str(tmp_path), "--topics", "ok," + "é" * 43])
    with pytest.raises(ConfigError, match=r"pulsar\.topics: cannot offload 'é+': .* 255 a directory name can hold"):
        config_from_args(args)
    args = build_parser().parse_args(["run", "--store", str(tmp_path), "--topics", "ok," + "é" * 42])
    assert config_from_args(args)[0].pulsar.topics == ("ok", "é" * 42)


def test_a_second_instance_is_refused_with_the_way_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README "Operating": a second instance on the store prefix is refused before Spark starts, in one line
    that names the holder and `run --take-over` (the lease alone cannot name the command's option)."""
    from streamoffload.checkpoints.lease import WriterLease

    store_dir = tmp_path / "store"
    store_dir.mkdir()
    WriterLease(ScopedStore(FilesystemStore(str(store_dir))), "other-instance").acquire()
    argv = ["run", "--store", str(store_dir), "--service-url", "pulsar://127.0.0.1:1", "--topics", "t"]
    assert main([*argv, "--checkpoint", str(tmp_path / "ckpt"), "--once", "--metrics-address", ""]) == 1
    line = one_error_line(capsys.readouterr().err, "run")
    assert "is being written by instance other-instance" in line and "`run --take-over`" in line
