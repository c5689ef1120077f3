"""Count the uses of ``typing.Any`` per import layer and hold each layer to its ceiling (part of
scripts/check_layers.sh).

The layers are those of the layers contract in pyproject.toml ([tool.importlinter]); a module counts in the
layer that names it or its nearest package. What no layer names (the leaves every layer may import, the package
roots) is one more row. A use is the name ``Any`` (or ``typing.Any``) anywhere in the code, annotations
included; imports are not uses. Generated protobuf modules are not counted.

Exit status 1 when a layer has more than its ceiling in scripts/any_ceiling.txt, or has none there.
``--write`` writes the current counts as the ceilings.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CEILING_FILE = ROOT / "scripts" / "any_ceiling.txt"
PACKAGE = "streamoffload"
UNLAYERED = "(unlayered: leaves, package roots)"


def layers(pyproject: dict[str, object]) -> list[str]:
    """The layers contract's layers, top first, each as written there."""
    linter = pyproject["tool"]["importlinter"]  # type: ignore[index]
    for contract in linter["contracts"]:
        if contract["type"] == "layers":
            return [str(layer) for layer in contract["layers"]]
    raise SystemExit("any_count: pyproject.toml has no layers contract in [tool.importlinter]")


def layer_modules(layer: str) -> list[str]:
    """The modules of one layer entry (siblings are separated by ``|`` or ``:``)."""
    return [m.strip() for m in layer.replace(":", "|").split("|") if m.strip()]


def short(layer: str) -> str:
    """A layer as the table and the ceiling file name it: without the package prefix."""
    return " | ".join(m.removeprefix(PACKAGE + ".") for m in layer_modules(layer))


def module_files(pyproject: dict[str, object]) -> dict[str, Path]:
    """Every module of the package and its file, through setuptools' package-dir (the code folders are
    subpackages installed from the top of the repository; the folders do not nest)."""
    dirs = pyproject["tool"]["setuptools"]["package-dir"]  # type: ignore[index]
    out: dict[str, Path] = {}
    for package, folder in sorted(dirs.items()):
        base = ROOT / folder
        for path in base.rglob("*.py"):
            if path.name.endswith("_pb2.py") or ".venv" in path.parts:
                continue
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            out[name] = path
    return out


def any_uses(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Any":
            count += 1
        elif isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name):
            count += node.value.id in ("typing", "t")
    return count


def counts() -> dict[str, int]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        pyproject = tomllib.load(f)
    names = layers(pyproject)
    owners = {m: short(layer) for layer in names for m in layer_modules(layer)}
    out = {short(layer): 0 for layer in names}
    out[UNLAYERED] = 0
    for module, path in module_files(pyproject).items():
        prefixes = [".".join(module.split(".")[:i]) for i in range(module.count(".") + 1, 0, -1)]
        owner = next((owners[p] for p in prefixes if p in owners), UNLAYERED)  # the nearest package a layer names
        out[owner] += any_uses(path)
    return out


def read_ceilings() -> dict[str, int]:
    ceilings: dict[str, int] = {}
    if not CEILING_FILE.exists():
        return ceilings
    for number, line in enumerate(CEILING_FILE.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        value, _, layer = line.partition(" ")
        if not value.isdigit() or not layer.strip():
            raise SystemExit(f"any_count: {CEILING_FILE.name}:{number}: expected '<count> <layer>', got {line!r}")
        ceilings[layer.strip()] = int(value)
    return ceilings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the current counts to {CEILING_FILE.name}")
    args = parser.parse_args()
    found = counts()
    if args.write:
        lines = [
            "# The most uses of typing.Any each import layer may have (scripts/any_count.py, run by check_layers.sh).",
            "# Lower a ceiling when a layer's count drops; raising one needs a reason in the commit message.",
        ]
        lines += [f"{n} {layer}" for layer, n in found.items()]
        CEILING_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ceilings = read_ceilings()
    width = max(len(layer) for layer in found)
    print(f"{'layer':<{width}}  Any  ceiling")
    failed = []
    for layer, n in found.items():
        ceiling = ceilings.get(layer)
        mark = ""
        if ceiling is None:
            failed.append(f"layer {layer!r} has no ceiling in scripts/{CEILING_FILE.name}")
            mark = "  <- no ceiling"
        elif n > ceiling:
            failed.append(f"layer {layer!r} uses Any {n} times, above its ceiling {ceiling}")
            mark = "  <- above"
        print(f"{layer:<{width}}  {n:>3}  {'-' if ceiling is None else ceiling:>7}{mark}")
    print(f"{'total':<{width}}  {sum(found.values()):>3}")
    for layer in sorted(set(ceilings) - set(found)):
        print(f"note: scripts/{CEILING_FILE.name} names {layer!r}, which is no longer a layer", file=sys.stderr)
    for problem in failed:
        print(f"any_count: {problem} (type it, or give the reason for a higher ceiling)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
