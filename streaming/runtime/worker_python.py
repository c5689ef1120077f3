"""Spark's local Python workers import pyspark from site-packages, where its bytecode is cached.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on the PYTHONPATH of every
Python process it starts: the worker daemon and its workers, each streaming source's runner, each data
source planner, transformWithState's driver-side runner. Python caches no bytecode for modules imported
from a zip, so each of those processes compiled pyspark (and pandas glue) from source again. Measured with
py-spy in ``bench/offload.py``: the largest single item of the Python workers' CPU, seconds per query
start. A pip-installed pyspark is the same code in site-packages, with cached bytecode.

Spark also puts its ``spark-core`` jar on that PYTHONPATH (for deployments that ship pyspark inside it; a
pip-installed Spark's jar holds no Python). Python treats the jar as a zip of modules: every import looks
in it first, and ``importlib.invalidate_caches()``, which Spark's workers call at every task
(``setup_spark_files``), re-reads its directory of ~6,000 entries in pure Python; ``importlib.metadata``
lookups walk it too. py-spy put that at a quarter of the workers' CPU in a 600 MB offload (2026-11-25).

In local mode the workers run on this machine with this interpreter, so :func:`worker_python` gives Spark
a small launcher (``PYSPARK_PYTHON``) that drops those two zips from PYTHONPATH and runs the interpreter.
It is used only when the driver itself imported pyspark from a directory (not from a zip), so the workers
find the same pyspark there; otherwise Spark's own PYTHONPATH stands.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import tempfile

from streamoffload.streaming.runtime import fork_client
from streamoffload.streaming.runtime.side_files import write_text_file

LAUNCHER = """#!/bin/sh
# Written by streamoffload (streaming/runtime/worker_python.py): Spark's Python workers without pyspark.zip, py4j's
# zip and Spark's jar on PYTHONPATH, so pyspark is imported from site-packages with cached bytecode.
set -f
kept=
IFS=:
for entry in ${{PYTHONPATH-}}; do
    case $entry in
        */pyspark.zip | */py4j-*-src.zip | *.jar) ;;
        *) kept=${{kept:+$kept:}}$entry ;;
    esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
# Spark's Python processes (its worker daemons, one per kind, and what they fork) from the fork
# server, with the imports done (streaming/runtime/fork_server.py).
if [ -n "${{STREAMOFFLOAD_FORK_SERVER-}}" ] && [ "${{1-}}" = -m ]; then
    exec {python} -I -S {client} "$@"
fi
exec {python} "$@"
"""


def pyspark_from_directory() -> bool:
    """Whether this process imports pyspark from a directory (a pip install), not from Spark's zip."""
    import pyspark

    return ".zip" not in (pyspark.__file__ or ".zip")


def launcher_directory() -> str:
    """Where launchers are written: the user's cache directory, not the temporary one, whose cleaners
    (systemd-tmpfiles, tmpreaper) could remove a launcher under a job that runs for weeks and starts
    Python workers again after every restart; the temporary directory only when the cache is not writable."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "streamoffload")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.access(directory, os.W_OK):
            return directory
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), f"streamoffload-{os.getuid()}")


def worker_python(directory: str | None = None, python: str = sys.executable) -> str:
    """The path of a launcher for ``python`` (written once, atomically, under ``directory``, default
    :func:`launcher_directory`), to be Spark's ``PYSPARK_PYTHON`` in local mode."""
    text = LAUNCHER.format(python=shlex.quote(python), client=shlex.quote(fork_client.__file__))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = directory or launcher_directory()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"python-worker-{digest}.sh")
    if not os.path.exists(path):
        write_text_file(path, text, temp_prefix=".python-worker-", mode=0o700)
    return path


__all__ = ["launcher_directory", "pyspark_from_directory", "worker_python"]
