"""``streamoffload table sync|rebuild|show`` on a real filesystem store and its default SQLite catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamoffload.cli import main
from streamoffload.storage.location import parse_store_url
from tests.table.offload import TopicOffload

ORDERS = "persistent://public/default/orders"
AUDIT = "persistent://public/default/audit"


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[TopicOffload]]:
    root = tmp_path / "store"
    scoped = parse_store_url(str(root)).open()
    offloads = [TopicOffload(scoped, f"{ORDERS}-partition-{i}") for i in range(2)] + [TopicOffload(scoped, AUDIT)]
    for offload, n in zip(offloads, (12, 7, 5), strict=True):
        offload.publish(n)
    return root, offloads


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["table", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sync_then_show_every_topic(store: tuple[Path, list[TopicOffload]], capsys: pytest.CaptureFixture[str]) -> None:
    root, offloads = store
    code, out, _ = run(capsys, "show", "--store", str(root))
    assert code == 0
    assert "public.default.orders (persistent://public/default/orders): no table yet" in out
    assert f"  {ORDERS}-partition-0: table at -, store at 3:11: 1 segment(s), 12 entries behind" in out
    code, out, _ = run(capsys, "sync", "--store", str(root), "--json")
    assert code == 0
    doc = json.loads(out)
    by_table = {t["table"]: t for t in doc["tables"]}
    assert sorted(by_table) == ["public.default.audit", "public.default.orders"]
    orders = by_table["public.default.orders"]
    assert orders["created"] and orders["rows"] == len(offloads[0].rows) + len(offloads[1].rows)
    assert orders["positions"] == {f"{ORDERS}-partition-0": [3, 11], f"{ORDERS}-partition-1": [3, 6]}
    assert (root / "_iceberg" / "catalog.db").is_file()
    assert all(f.startswith((root / "_iceberg" / "warehouse").as_uri()) for c in orders["commits"] for f in c["files"])
    code, out, _ = run(capsys, "sync", "--store", str(root), "orders")
    assert code == 0
    assert out == f"{ORDERS} -> public.default.orders: up to date (snapshot {orders['snapshot_id']})\n"
    offloads[2].publish(4)
    code, out, _ = run(capsys, "show", "--store", str(root), AUDIT, "--orphans", "--orphan-grace-minutes", "0")
    assert code == 0
    assert f"  {AUDIT}: table at 3:4, store at 3:8: 1 segment(s), 4 entries behind" in out
    assert "  0 orphan data file(s) (no snapshot references them)\n" in out


def test_rebuild_and_a_custom_catalog(
    store: tuple[Path, list[TopicOffload]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, offloads = store
    catalog = tmp_path / "elsewhere" / "tables.db"
    args = ["--store", str(root), "--catalog", str(catalog)]
    code, out, _ = run(capsys, "rebuild", *args, f"{ORDERS}-partition-1", "--segments-per-commit", "1")
    assert code == 0
    rows = len(offloads[0].rows) + len(offloads[1].rows)
    assert out.startswith(f"{ORDERS} -> public.default.orders: rebuilt with {rows} message(s) of 2 segment(s) in 2")
    assert (tmp_path / "elsewhere" / "warehouse" / "public.default" / "orders").is_dir()
    assert not (root / "_iceberg").exists()
    code, out, _ = run(capsys, "show", *args, "orders", "--json")
    status = json.loads(out)["tables"][0]
    assert status["rows"] == rows and status["segments_behind"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "--store", "{root}", "nope"], "topic persistent://public/default/nope has no offloaded data in"),
        (["sync", "--store", "s3://bucket/pulsar"], "has no local directory for the default SQLite catalog"),
        (
            ["sync", "--store", "{root}", "--catalog", "nosuch+driver://x:secret@h/db", "--warehouse", "{root}/w"],
            "cannot open it",
        ),
        (["sync", "--store", "{root}", "--catalog", "postgresql://u:secret@127.0.0.1:1/db"], "give --warehouse"),
        (["sync", "--store", "{root}", "--warehouse", "ftp://h/w"], "--warehouse ftp://h/w: expected file:///dir"),
        (["sync", "--store", "{root}/missing"], "missing"),
        (["sync", "--store", "{root}", "--segments-per-commit", "0"], "--segments-per-commit 0"),
    ],
)
def test_errors_are_one_line_and_keep_secrets(
    store: tuple[Path, list[TopicOffload]], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    root, _ = store
    code, out, err = run(capsys, *[a.replace("{root}", str(root)) for a in argv])
    assert code == 1 and out == ""
    assert err.startswith("streamoffload table: error: ") and err.count("\n") == 1, err
    assert message in err and "secret" not in err


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["table", "sync", "--help"])
    out = capsys.readouterr().out
    assert "--catalog URI" in out and "--warehouse URL" in out and "examples:" in out
    assert "streamoffload table sync --store var/demo/store" in out


def test_other_commands_do_not_load_pyiceberg(store: tuple[Path, list[TopicOffload]]) -> None:
    """pyiceberg is an optional extra: the table command imports it when it runs, never when the parser is built."""
    import subprocess
    import sys

    root, _ = store
    code = (
        "import sys\nfrom streamoffload.cli import main\n"
        f"code = main(['status', '--store', {str(root)!r}, '--no-broker', '--json'])\n"
        "print('pyiceberg' in sys.modules, 'pyspark' in sys.modules, code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines()[-1] == "False False 0"
