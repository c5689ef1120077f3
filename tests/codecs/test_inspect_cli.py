"""`streamoffload inspect` on local files: the JSON document, the summary, and corrupt input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest

from streamoffload.cli import main
from streamoffload.codecs.block_writer import Block, BlockWriter
from streamoffload.codecs.blocks import FormatVersion
from streamoffload.codecs.index import build_index

V1, V2 = FormatVersion.V1, FormatVersion.V2


def payload(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode() * (entry % 5)


def write_object(
    directory: Path, name: str, version: FormatVersion, entries: list[tuple[int, int]], max_block: int = 300
) -> tuple[Path, Path, list[Block]]:
    writer = BlockWriter(version, max_block)
    blocks = [b for ledger, entry in entries for b in writer.add(ledger, entry, payload(ledger, entry))]
    blocks += writer.flush()
    data = b"".join(b.data for b in blocks)
    index = build_index(version, blocks, len(data), {b.ledger_id: b"\x08\x01" for b in blocks})
    data_path, index_path = directory / name, directory / f"{name}-index"
    data_path.write_bytes(data)
    index_path.write_bytes(index.encode())
    return data_path, index_path, blocks


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


V2_ENTRIES = [(4, e) for e in range(12)] + [(9, e) for e in range(3, 8)]


def test_v2_json_with_index_and_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, index_path, blocks = write_object(tmp_path, "5f0c1e2a-0000-4000-8000-000000000001", V2, V2_ENTRIES)
    code, out, err = run_cli(capsys, data_path, index_path, "--json", "--entries")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "v2"
    assert [
        (b["offset"], b["length"], b["ledger_id"], b["first_entry_id"], b["entry_count"]) for b in doc["blocks"]
    ] == [(b.offset, b.length, b.ledger_id, b.first_entry_id, b.entry_count) for b in blocks]
    assert {k: (v["entries"], v["first_entry_id"], v["last_entry_id"]) for k, v in doc["ledgers"].items()} == {
        "4": (12, 0, 11),
        "9": (5, 3, 7),
    }
    assert doc["entries"] == [
        {
            "ledger_id": ledger,
            "entry_id": entry,
            "length": len(payload(ledger, entry)),
            "crc32c": crc32c.crc32c(payload(ledger, entry)),
        }
        for ledger, entry in V2_ENTRIES
    ]
    assert doc["index"]["agrees_with_data"] is True
    assert doc["index"]["data_object_length"] == data_path.stat().st_size


def test_without_entries_flag_there_is_no_entry_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, _, _ = write_object(tmp_path, "obj", V2, V2_ENTRIES)
    code, out, _ = run_cli(capsys, data_path, "--json")
    assert code == 0
    doc = json.loads(out)
    assert "entries" not in doc and "index" not in doc


@pytest.mark.parametrize(
    ("name", "extra", "expected"),
    [
        ("1b4e28ba-2fa1-11d2-883f-0016d3cca427-ledger-42", [], 42),
        ("some-copy", ["--ledger-id", "7"], 7),
        ("some-copy", [], None),
    ],
)
def test_v1_ledger_id_from_flag_name_or_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, extra: list[str], expected: int | None
) -> None:
    data_path, index_path, blocks = write_object(tmp_path, name, V1, [(42, e) for e in range(15)])
    code, out, err = run_cli(capsys, data_path, index_path, "--json", "--entries", *extra)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "v1"
    assert {b["ledger_id"] for b in doc["blocks"]} == {expected}
    assert {e["ledger_id"] for e in doc["entries"]} == {expected}
    key = "unknown" if expected is None else str(expected)
    assert doc["ledgers"] == {
        key: {
            "entries": 15,
            "first_entry_id": 0,
            "last_entry_id": 14,
            "bytes": sum(len(payload(42, e)) for e in range(15)),
            "blocks": len(blocks),
        }
    }


def test_v1_ledger_id_from_the_index_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, index_path, _ = write_object(tmp_path, "x", V1, [(42, e) for e in range(3)])
    named = index_path.rename(tmp_path / "abc-ledger-42-index")
    code, out, _ = run_cli(capsys, data_path, named, "--json")
    assert code == 0
    assert list(json.loads(out)["ledgers"]) == ["42"]


def test_readable_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, index_path, blocks = write_object(tmp_path, "obj", V2, V2_ENTRIES)
    code, out, _ = run_cli(capsys, data_path, index_path, "--entries")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{data_path}: v2 data object, {data_path.stat().st_size:,} bytes, {len(blocks)} blocks")
    assert "2 ledgers, 17 entries" in lines[0]
    assert any(line.split()[:3] == ["4", "entries", "0..11"] for line in lines)
    assert any("agrees with the data object" in line for line in lines)
    crc = crc32c.crc32c(payload(9, 7))
    assert any(line.split() == ["9", "7", str(len(payload(9, 7))), f"{crc:08x}"] for line in lines)


def test_corrupt_data_exits_1_naming_file_and_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, index_path, blocks = write_object(tmp_path, "obj", V2, V2_ENTRIES)
    raw = bytearray(data_path.read_bytes())
    raw[blocks[1].offset + 100] = 1  # a reserved header byte of the second block
    data_path.write_bytes(raw)
    code, out, err = run_cli(capsys, data_path, index_path, "--json")
    assert code == 1 and out == ""
    assert f"{data_path}: reserved block header byte" in err
    assert f"(at byte offset {blocks[1].offset + 100})" in err


def test_truncated_data_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, _, _ = write_object(tmp_path, "obj", V2, V2_ENTRIES)
    data_path.write_bytes(data_path.read_bytes()[:-1])
    code, _, err = run_cli(capsys, data_path)
    assert code == 1
    assert "extends past the end" in err and str(data_path) in err


def test_index_that_disagrees_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_path, _, _ = write_object(tmp_path, "a", V2, V2_ENTRIES)
    _, other_index, _ = write_object(tmp_path, "b", V2, V2_ENTRIES, max_block=400)
    code, _, err = run_cli(capsys, data_path, other_index)
    assert code == 1
    assert str(other_index) in err and "at byte offset" in err
    _, v1_index, _ = write_object(tmp_path, "c-ledger-4", V1, [(4, e) for e in range(12)])
    code, _, err = run_cli(capsys, data_path, v1_index)
    assert code == 1 and "v1 index for the v2 data object" in err


def test_missing_and_empty_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, tmp_path / "nope")
    assert code == 1 and "cannot read" in err and "nope" in err
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    code, _, err = run_cli(capsys, empty)
    assert code == 1 and "data object is empty" in err


def test_console_entry_point(tmp_path: Path) -> None:
    data_path, index_path, _ = write_object(tmp_path, "obj", V2, V2_ENTRIES)
    done = subprocess.run(
        [sys.executable, "-m", "streamoffload", "inspect", str(data_path), str(index_path), "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "v2"
