"""docs/DESIGN.md's module table names every module of the tree, in the row of the folder it lives in, and has a
row for every room of ``streaming/`` (issue 27: the table had drifted from the tree)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "codecs/": ROOT / "codecs",
    "storage/": ROOT / "storage",
    "pulsar/": ROOT / "streamoffload" / "pulsar",
    "checkpoints/": ROOT / "checkpoints",
    "read/": ROOT / "read",
    "read/segment/": ROOT / "read" / "segment",
    "metrics/": ROOT / "streamoffload" / "metrics",
    "dashboard/": ROOT / "streamoffload" / "dashboard",
    "table/": ROOT / "streamoffload" / "table",
}
FOLDERS.update(
    {
        f"streaming/{room.name}/": room
        for room in sorted((ROOT / "streaming").iterdir())
        if room.is_dir() and (room / "__init__.py").exists()
    }
)


def table_rows() -> dict[str, str]:
    """Package cell -> modules cell, from the table under "Layers"."""
    rows = {}
    for line in (ROOT / "docs" / "DESIGN.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = cells[2]
    return rows


def contents(folder: Path) -> set[str]:
    modules = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
    packages = {f"{path.name}/" for path in folder.iterdir() if (path / "__init__.py").exists()}
    return modules | packages


def test_every_folder_has_a_row_naming_each_of_its_modules() -> None:
    rows = table_rows()
    for name, folder in FOLDERS.items():
        assert name in rows, f"docs/DESIGN.md: no row for {name}"
        named = set(re.findall(r"`([\w/]+)`", rows[name]))
        missing = contents(folder) - named
        assert not missing, f"docs/DESIGN.md: the {name} row does not name {sorted(missing)}"


def test_no_row_for_a_folder_that_is_gone() -> None:
    for name in table_rows():
        if name.endswith("/") and name != "commands/":
            assert name in FOLDERS, f"docs/DESIGN.md names {name}, which is not in the tree"


def test_streaming_has_no_module_outside_its_rooms() -> None:
    """streaming/ holds rooms; beside them only its __init__ (``register``) and its errors' base."""
    assert sorted(path.name for path in (ROOT / "streaming").glob("*.py")) == ["__init__.py", "errors.py"]
