"""The pyspark the code relies on, beyond its documented API, is the installed one's: every pyspark module and
name the package imports (found in its source), the private modules ``streaming/runtime/`` runs or preloads by
name (where a moved one only costs speed, silently: ``preload`` skips what does not import), and the private
attributes the session uses. A pyspark release that moves any of them fails here, not in production; and the
installed pyspark is inside ``pyproject.toml``'s range."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from streamoffload.streaming.runtime.fork_server import RUNNER_MODULES
from streamoffload.streaming.runtime.worker_daemon import PRELOADED

ROOT = Path(__file__).resolve().parents[3]
SOURCE_DIRS = ("streamoffload", "codecs", "storage", "checkpoints", "read", "streaming")


def _pyspark_imports() -> set[tuple[str, str | None]]:
    """(module, name) for every ``from pyspark... import name`` and (module, None) for ``import pyspark...``."""
    found: set[tuple[str, str | None]] = set()
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyspark":
                    found.update((node.module or "", alias.name) for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update((a.name, None) for a in node.names if a.name.split(".")[0] == "pyspark")
    return found


IMPORTS = sorted(_pyspark_imports(), key=lambda item: (item[0], item[1] or ""))


def test_the_source_scan_finds_the_adapters_imports():
    assert ("pyspark.sql.streaming.stateful_processor", "StatefulProcessor") in IMPORTS
    assert ("pyspark.java_gateway", "launch_gateway") in IMPORTS
    assert ("pyspark.daemon", "manager") in IMPORTS
    assert ("pyspark.sql.datasource", "EqualTo") in IMPORTS


@pytest.mark.parametrize(("module", "name"), IMPORTS, ids=[f"{m}:{n}" for m, n in IMPORTS])
def test_every_pyspark_import_of_the_package_resolves(module, name):
    imported = importlib.import_module(module)
    if name is not None:
        assert hasattr(imported, name), f"{module} has no {name}"


RUNTIME_MODULES = sorted({name for name in (*RUNNER_MODULES, *PRELOADED) if name.startswith("pyspark.")})


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_every_pyspark_module_runtime_names_imports(module):
    """fork_server.RUNNER_MODULES (run by name as ``python -m``) and worker_daemon.PRELOADED (imported ahead)."""
    importlib.import_module(module)


def test_the_private_attributes_the_session_uses():
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    assert "popen_kwargs" in inspect.signature(launch_gateway).parameters  # the JVM's output piped to us
    assert hasattr(SparkContext, "_gateway")  # None until a gateway is up
    assert "gateway" in inspect.signature(SparkContext._ensure_initialized).parameters
    assert "loadDefaults" in inspect.signature(SparkConf).parameters  # spark-submit's settings (submitted_conf)


def test_the_versioned_public_apis_the_job_needs():
    """What sets pyspark's floor: the row-based transformWithState (4.1), Python data source filter pushdown
    (4.1) and streaming sources' read limits and latest offsets (4.2)."""
    from pyspark.sql import GroupedData
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

    transform = inspect.signature(GroupedData.transformWithState).parameters
    assert {"statefulProcessor", "outputStructType", "outputMode", "timeMode"} <= set(transform)
    assert "pushFilters" in vars(DataSourceReader)
    assert {"getDefaultReadLimit", "reportLatestOffset"} <= set(vars(DataSourceStreamReader))
    assert list(inspect.signature(DataSourceStreamReader.latestOffset).parameters) == ["self", "start", "limit"]


def test_the_installed_pyspark_is_in_the_declared_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (spec,) = [Requirement(d) for d in project["dependencies"] if re.match(r"pyspark\b", d)]
    installed = importlib.metadata.version("pyspark")
    assert spec.specifier.contains(installed), f"pyspark {installed} is outside pyproject.toml's {spec}"
    assert not spec.specifier.contains("4.4.0") and not spec.specifier.contains("4.1.0")  # untested minors
