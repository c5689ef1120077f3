"""scripts/any_count.py: what counts as a use of Any, which layer a module counts in, and the ceiling check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "any_count.py"


@pytest.fixture
def any_count() -> ModuleType:
    spec = importlib.util.spec_from_file_location("any_count", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uses_are_names_and_typing_attributes_not_imports(any_count: ModuleType, tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import Any\n"
        "import typing\n"
        "x: dict[str, Any] = {}\n"
        "def f(a: 'Any', b: typing.Any) -> list[Any]:\n"
        "    return [a.Any]\n"
    )
    # dict[str, Any], typing.Any and list[Any]; not the import, the string annotation or an attribute of a value.
    assert any_count.any_uses(source) == 3


def test_a_module_counts_in_the_layer_of_its_nearest_named_package(any_count: ModuleType) -> None:
    found = any_count.counts()
    table = "streaming.source | streaming.segmenter | streaming.sink"
    assert list(found)[:2] == ["cli", "commands"]
    assert table in found and "codecs" in found and any_count.UNLAYERED in found
    assert found["codecs"] == 0  # codecs/ has no Any: the strict bottom layer


def test_a_layer_above_its_ceiling_fails(
    any_count: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = any_count.counts()
    ceiling = tmp_path / "any_ceiling.txt"
    ceiling.write_text("".join(f"{n} {layer}\n" for layer, n in found.items()))
    monkeypatch.setattr(any_count, "CEILING_FILE", ceiling)
    monkeypatch.setattr(sys, "argv", ["any_count.py"])
    assert any_count.main() == 0
    lowered = found["checkpoints"] - 1
    ceiling.write_text(
        "".join(f"{lowered if layer == 'checkpoints' else n} {layer}\n" for layer, n in found.items() if layer != "cli")
    )
    assert any_count.main() == 1
    err = capsys.readouterr().err
    assert f"layer 'checkpoints' uses Any {found['checkpoints']} times, above its ceiling {lowered}" in err
    assert "layer 'cli' has no ceiling in scripts/any_ceiling.txt" in err
