"""Fail on an import cycle between the modules of ``streamoffload`` (part of scripts/check_layers.sh; issue 53:
"no import cycle, not even under TYPE_CHECKING").

The graph is built from the source with ``ast``, through setuptools' package-dir (``scripts/any_count.py``'s
``module_files``). An edge is every ``import x`` and ``from x import y`` at module level, including those under
``if TYPE_CHECKING:`` and inside ``try``/``if`` blocks: import-linter does not see a cycle, and mypy accepts one,
yet both make two modules one idea split in two. An import inside a function or method is a deliberate lazy
import (a heavy dependency, or a command's code loaded on use) and does not count; ``--lazy`` counts it too, for
a look. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. Importing a
module does not count as importing its parent packages (a package's ``__init__`` that re-exports a child is an
edge only from the package to the child).

Exit status 1 naming each cycle (the modules in import order, the first again at the end).
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from any_count import PACKAGE, ROOT, module_files


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from`` import's module."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: set[str], lazy: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.modules = modules
        self.lazy = lazy
        self.found: set[str] = set()

    def _target(self, name: str) -> str | None:
        """The package module ``name`` is, or lies in (None: outside the package)."""
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._add(self._target(alias.name))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.module, self.is_package, node)
        if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
            return
        for alias in node.names:
            child = f"{base}.{alias.name}"
            self._add(child if child in self.modules else self._target(base))

    def _add(self, target: str | None) -> None:
        if target is not None and target != self.module:
            self.found.add(target)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if self.lazy:
            self.generic_visit(node)

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = module_files(pyproject)
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in sorted(files.items()):
        visitor = _Imports(module, path.name == "__init__.py", modules, lazy)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        graph[module] = visitor.found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan's algorithm,
    iterative), each as the path from its least module back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return sorted((_path_within(graph, component) for component in components), key=lambda c: c[0])


def _path_within(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle from the component's least module back to it (breadth first, inside the component)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"import_cycles: {start} is in no cycle")  # a component of two or more always has one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lazy", action="store_true", help="count imports inside functions too")
    args = parser.parse_args(argv)
    found = cycles(import_graph(lazy=args.lazy))
    for cycle in found:
        print("import cycle: " + " -> ".join(m.removeprefix(PACKAGE + ".") for m in cycle), file=sys.stderr)
    if not found:
        print("Import cycles: none" + (" (lazy imports included)" if args.lazy else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
