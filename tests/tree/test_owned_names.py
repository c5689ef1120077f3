"""A type the stages share is imported from the module that owns it, never through another that imports it
(issue 53: ``Position`` came from three modules, an entry's metadata was spelled three ways)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {
    "Position": "streamoffload.codecs.positions",
    "Entry": "streamoffload.streaming.handoff.entry",
}
TREES = ("codecs", "storage", "checkpoints", "read", "streaming", "streamoffload", "tests", "bench")


def test_each_shared_type_is_imported_from_its_owner() -> None:
    elsewhere = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        owner = OWNERS.get(alias.name)
                        if owner is not None and node.module != owner:
                            elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from {node.module}")
    assert elsewhere == []
