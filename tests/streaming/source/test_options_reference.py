"""docs/source-options.md is what scripts/gen_source_options.py writes from the option definitions, and those
definitions name every option ``SourceOptions.parse`` reads (issue 53: the options reference generated, not
kept by hand beside the code)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

from streamoffload.streaming.source import source_options
from streamoffload.streaming.source.source_options import OPTIONS

ROOT = Path(__file__).resolve().parents[3]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_source_options", ROOT / "scripts" / "gen_source_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_is_what_the_script_writes() -> None:
    written = (ROOT / "docs" / "source-options.md").read_text()
    assert written == generator().render(), "docs/source-options.md is stale: run scripts/gen_source_options.py"


def test_every_option_read_is_documented_once() -> None:
    documented = [name.lower() for option in OPTIONS for name in option.names]
    assert len(documented) == len(set(documented)), "an option is documented twice"
    read = set(re.findall(r'get\("([^"]+)"\)', inspect.getsource(source_options)))
    read.discard("receiverqueuesize")  # pulsar.reader.receiverQueueSize, one of pulsar.reader.*
    missing = {name for name in read if name.lower() not in documented}
    assert not missing, f"SourceOptions reads options OPTIONS does not document: {sorted(missing)}"


def test_a_changed_definition_makes_the_doc_stale() -> None:
    gen = generator()
    before = gen.render()
    first = OPTIONS[0]
    gen.OPTIONS = (type(first)(first.names, first.default, first.summary + " Changed."), *OPTIONS[1:])
    assert gen.render() != before
    assert "Changed." in gen.render()
