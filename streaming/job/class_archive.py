"""The driver JVM's classes kept between runs: a dynamic class-data archive (AppCDS, JDK 13 and later), so a
scheduled ``run --once`` does not load, parse and verify Spark's classes again every time.

Measured (``bench/start_time.py``, 600 MB on pulsar-lite, a calm machine): the first read came 7.9 s after launch
without an archive and 4.9 s with one (``getOrCreate`` 2.3 -> 1.0 s, the query's start 1.0 -> 0.5 s, its first
planning 1.05 -> 0.5 s). The run that writes the archive pays for it at its end, once: ~8 s for ~160 MB.

- **Valid only for what made it.** An archive is named by a digest of the JVM (its ``java``, its ``release``
  file), its heap, and the class path (where Spark's jars are, their names, sizes and modification times, as the
  JVM checks them: a reinstalled pyspark has new times, and an archive it refuses would never be written again;
  the configured extra jars and class path). The JVM checks what it maps all the same, and on a mismatch runs
  without it (a line in the Spark log).
- **Never read half-written.** A run without one has its JVM write one at exit (``-XX:ArchiveClassesAtExit``) under
  a temporary name; once the JVM is gone, :meth:`ClassArchive.finish` renames it into place. A temporary file of a
  process no longer running is removed by the next writer.
- **Bounded.** At most :data:`KEPT` archives stay in the directory, the most recently used (an upgrade of Spark
  or Java makes a new one), and none is written with less than :data:`MIN_FREE_BYTES` free there.
- **Never in the way.** Any failure (a directory that cannot be made, a full disk, a JVM that does not exit) costs
  the archive, never the run: it is logged, and the run goes on as without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamoffload.config import CLASS_ARCHIVE_AUTO
from streamoffload.units import GIB

log = logging.getLogger(__name__)

AUTO = CLASS_ARCHIVE_AUTO
"""``[spark] classArchive``'s default: ``$XDG_CACHE_HOME/streamoffload/jvm`` (``~/.cache`` without it)."""

KEPT = 2
"""Archives kept in the directory, the newest first."""

MIN_FREE_BYTES = 1 * GIB
"""No archive is written with less free space than this in its directory (an archive is ~160 MB)."""

EXIT_WAIT_S = 120.0
"""How long :meth:`ClassArchive.finish` waits for the JVM to write its archive and exit."""

_KEYED_SETTINGS = (
    "spark.jars",
    "spark.jars.packages",
    "spark.driver.extraClassPath",
    # A heap past 32 GB turns compressed pointers off, which the archive must match. Not the other Java options:
    # they may differ run by run (a log's path), and the JVM checks those that matter when it maps the archive.
    "spark.driver.memory",
)
_SUFFIX = ".jsa"


def archive_directory(setting: str) -> Path | None:
    """Where the archives are kept: ``setting`` (``[spark] classArchive``), ``auto`` for the user's cache, ``""``
    for none."""
    if not setting.strip():
        return None
    if setting == AUTO:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(cache) / "streamoffload" / "jvm"
    return Path(os.path.expanduser(setting))


def _java() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def archive_key(conf: Mapping[str, str], jars: Path) -> str | None:
    """A digest of the JVM, its heap and the class path (``jars``: Spark's) an archive is valid for; None where
    the JVM or the jars are not found."""
    java = _java()
    if java is None or not jars.is_dir():
        return None
    digest = hashlib.sha256()
    digest.update(f"{java}\0{jars.resolve()}".encode())  # the archive records the jars' paths, not just names
    with contextlib.suppress(OSError):
        digest.update((java.parent.parent / "release").read_bytes())
    for entry in sorted(os.scandir(jars), key=lambda e: e.name):
        stat = entry.stat()  # the JVM refuses an archive whose jars changed size or time: a reinstall makes new ones
        digest.update(f"\0{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    for key in _KEYED_SETTINGS:
        digest.update(f"\0{key}={conf.get(key, '')}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """This run's archive: ``path``, and ``writing`` (the temporary name) when this run's JVM writes it."""

    path: Path
    writing: Path | None

    def java_option(self) -> str:
        if self.writing is not None:
            return f"-XX:ArchiveClassesAtExit={self.writing}"
        return f"-XX:SharedArchiveFile={self.path}"

    def finish(self, jvm: subprocess.Popen[bytes] | None) -> None:
        """After the session stopped: with an archive to write, end ``jvm`` (its standard input closed: Spark's
        gateway then exits), wait for it to write the archive, and rename it into place."""
        if self.writing is None:
            return
        try:
            if jvm is not None:
                if jvm.stdin is not None:
                    jvm.stdin.close()
                jvm.wait(EXIT_WAIT_S)
            if self.writing.stat().st_size == 0:
                raise OSError(f"{self.writing} is empty")
            os.replace(self.writing, self.path)
            log.info("the JVM's classes are kept for the next runs' start-up in %s", self.path)
            _keep_newest(self.path.parent, KEPT)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("no class archive kept (%s): the next run starts without one", err)
            with contextlib.suppress(OSError):
                self.writing.unlink()


def class_archive(setting: str, conf: Mapping[str, str], jars: Path) -> ClassArchive | None:
    """The archive a driver JVM started with ``conf`` and Spark's ``jars`` uses or writes, per ``setting``
    (``[spark] classArchive``); None for none (off, no ``java`` or jars found, a directory that cannot be made,
    too little space)."""
    directory = archive_directory(setting)
    if directory is None:
        return None
    key = archive_key(conf, jars)
    if key is None:
        log.info("no class archive: java or Spark's jars not found")
        return None
    path = directory / f"spark-{key}{_SUFFIX}"
    if path.is_file():
        # Its time is when a run last used it: :func:`_keep_newest` then lets go of the least recently used, not
        # of the oldest written (two installs on one machine took turns evicting each other's, every run).
        with contextlib.suppress(OSError):
            os.utime(path)
        return ClassArchive(path, None)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_orphans(directory)
        free = shutil.disk_usage(directory).free
    except OSError as err:
        log.warning("no class archive in %s: %s", directory, err)
        return None
    if free < MIN_FREE_BYTES:
        log.warning("no class archive written in %s: %d bytes free, fewer than %d", directory, free, MIN_FREE_BYTES)
        return None
    return ClassArchive(path, directory / f"{path.name}.tmp-{os.getpid()}")


def _remove_orphans(directory: Path) -> None:
    """Temporary archives of processes no longer running (killed before their JVM wrote and renamed one)."""
    for entry in directory.glob(f"*{_SUFFIX}.tmp-*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                entry.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _keep_newest(directory: Path, kept: int) -> None:
    archives = sorted(directory.glob(f"spark-*{_SUFFIX}"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in archives[kept:]:
        with contextlib.suppress(OSError):
            old.unlink()
