"""Every error the project raises on purpose descends from the one root, ``StreamOffloadError``, so the command
line's one-line handling and every ``except StreamOffloadError`` see it. The exceptions that do not are signals
caught inside their own module, listed here with the reason."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tomllib
from pathlib import Path

from streamoffload.errors import StreamOffloadError

REPO = Path(__file__).resolve().parents[2]

SIGNALS = {
    # Control flow that never leaves its module: a fast path giving way to the per-entry one.
    "streamoffload.codecs.entry_columns._Irregular",
    "streamoffload.read.wire_arrays.Irregular",
    "streamoffload.read.dataset_read._Unprobed",
    # One upload attempt out of time: retried like a socket timeout, translated to a StorageError at the end.
    "streamoffload.storage.s3_errors.AttemptTimeout",
    # A consumer's delivery re-opened at once by the exactly-once loop, never raised past it.
    "streamoffload.pulsar.exactly_once.Resync",
    # A payload's refusal, the reason only: decompress raises it as the DecompressionError naming the entry.
    "streamoffload.codecs.compression._Refused",
}


def project_exceptions() -> dict[str, type[BaseException]]:
    # The top-level folders are installed as subpackages (pyproject's package-dir), each walked on its own: an
    # editable install does not put them under streamoffload's own folder.
    roots = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    names: set[str] = set()
    for root in roots:
        names |= {root} | {i.name for i in pkgutil.walk_packages(importlib.import_module(root).__path__, f"{root}.")}
    found: dict[str, type[BaseException]] = {}
    for name in sorted(names):
        if name.endswith(("_pb2", "__main__")):
            continue
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_project_error_descends_from_the_root() -> None:
    found = project_exceptions()
    outside = {name for name, cls in found.items() if not issubclass(cls, StreamOffloadError)}
    assert outside == SIGNALS
    # The walk found the tree's errors, not an empty package (one per layer, bottom to top).
    for name in (
        "streamoffload.codecs.errors.FormatError",
        "streamoffload.storage.base.StorageError",
        "streamoffload.checkpoints.lease.FencedError",
        "streamoffload.read.segment.errors.ReadError",
        "streamoffload.streaming.handoff.spool.TornSpoolError",
        "streamoffload.pulsar.exactly_once.PulsarIOError",
    ):
        assert name in found


def test_one_class_per_error_name() -> None:
    """Two unrelated classes of one name would make a traceback or an ``except`` say the wrong thing."""
    by_name: dict[str, list[str]] = {}
    for name, cls in project_exceptions().items():
        if name not in SIGNALS:
            by_name.setdefault(cls.__qualname__, []).append(name)
    assert {n: where for n, where in by_name.items() if len(where) > 1} == {}


# One base per layer: the only classes directly under the root (or under ConfigError, the one kind every layer may
# raise for a bad setting). Every other error specialises one of them, or a lower layer's error it is caught as.
LAYER_ROOTS = {
    "streamoffload.errors.ConfigError",
    "streamoffload.codecs.errors.CodecError",
    "streamoffload.storage.base.StorageError",
    "streamoffload.pulsar.exactly_once.PulsarIOError",
    "streamoffload.checkpoints.errors.CheckpointError",
    "streamoffload.read.segment.errors.ReadError",
    "streamoffload.table.errors.TableError",
    "streamoffload.streaming.errors.StreamingError",
    "streamoffload.cli_common.CommandError",
    # The services above the job, one module each: the embedded broker, the producer, the dashboard's push.
    "streamoffload.embedded_broker.BrokerError",
    "streamoffload.produce.ProduceError",
    "streamoffload.dashboard.errors.DashboardError",
}


def test_each_layer_has_one_error_base() -> None:
    """No error sits directly under the root but a layer's base: a new one names which layer's kind it is."""
    found = project_exceptions()
    assert set(found) >= LAYER_ROOTS
    direct = {
        name
        for name, cls in found.items()
        if StreamOffloadError in cls.__bases__
        and name not in SIGNALS
        and name != "streamoffload.errors.StreamOffloadError"
    }
    assert direct == LAYER_ROOTS
