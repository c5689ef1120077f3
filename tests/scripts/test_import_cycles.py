"""scripts/import_cycles.py: which imports are edges, the cycles it names, and the tree's verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_cycles.py"


@pytest.fixture(scope="module")
def import_cycles() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_cycles"] = module
    spec.loader.exec_module(module)
    return module


def test_a_two_module_cycle_is_named_from_its_least_module(import_cycles: ModuleType) -> None:
    graph = {"p.b": {"p.a"}, "p.a": {"p.b", "p.c"}, "p.c": set()}
    assert import_cycles.cycles(graph) == [["p.a", "p.b", "p.a"]]


def test_the_shortest_path_inside_a_component_is_named(import_cycles: ModuleType) -> None:
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles.cycles(graph) == [["a", "d", "a"]]


def test_no_cycle_in_a_chain_or_a_diamond(import_cycles: ModuleType) -> None:
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert import_cycles.cycles(graph) == []


def test_two_components_are_two_cycles(import_cycles: ModuleType) -> None:
    graph = {"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x"}}
    assert import_cycles.cycles(graph) == [["a", "b", "a"], ["x", "y", "z", "x"]]


def test_type_checking_imports_count_and_function_imports_do_not(import_cycles: ModuleType) -> None:
    import ast

    source = (
        "from typing import TYPE_CHECKING\n"
        "from streamoffload.storage import base\n"
        "if TYPE_CHECKING:\n"
        "    from streamoffload.storage.filesystem import FilesystemStore\n"
        "def f():\n"
        "    from streamoffload.read import verify\n"
    )
    modules = {"streamoffload.storage.base", "streamoffload.storage.filesystem", "streamoffload.read.verify", "m"}
    eager = import_cycles._Imports("m", False, modules, False)
    eager.visit(ast.parse(source))
    assert eager.found == {"streamoffload.storage.base", "streamoffload.storage.filesystem"}
    lazy = import_cycles._Imports("m", False, modules, True)
    lazy.visit(ast.parse(source))
    assert lazy.found == {
        "streamoffload.storage.base",
        "streamoffload.storage.filesystem",
        "streamoffload.read.verify",
    }


def test_the_tree_has_no_import_cycle(import_cycles: ModuleType) -> None:
    assert import_cycles.cycles(import_cycles.import_graph()) == []
