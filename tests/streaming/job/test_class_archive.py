"""The driver JVM's class archive (``streaming/job/class_archive.py``): named by what it is valid for, written under
a temporary name and renamed once the JVM is gone, bounded, and never in a run's way; then a real JVM writes one
and the next maps its classes from it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamoffload.config import parse_config
from streamoffload.streaming.job import class_archive
from streamoffload.streaming.job.class_archive import (
    AUTO,
    ClassArchive,
    archive_directory,
    archive_key,
)
from streamoffload.streaming.job.session import _spark_jars, _with_class_archive

REPO = Path(__file__).resolve().parents[3]


def test_the_setting_names_the_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert archive_directory(AUTO) == tmp_path / "cache" / "streamoffload" / "jvm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert archive_directory(AUTO) == tmp_path / "home" / ".cache" / "streamoffload" / "jvm"
    assert archive_directory("") is None and archive_directory("  ") is None
    assert archive_directory("~/jsa") == tmp_path / "home" / "jsa"
    assert parse_config({}).spark.class_archive == AUTO
    (tmp_path / "job.toml").write_text('[spark]\nclassArchive = "jvm"\n')
    from streamoffload.config import load_config

    assert load_config(tmp_path / "job.toml").spark.class_archive == str(tmp_path / "jvm")  # beside the file


def test_the_key_follows_the_class_path_and_the_jvm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spark = _spark_jars()
    base = archive_key({}, spark)
    assert base is not None and len(base) == 16 and archive_key({}, spark) == base
    assert archive_key({"spark.jars": "/opt/extra.jar"}, spark) not in (None, base)
    assert archive_key({"spark.driver.memory": "40g"}, spark) not in (None, base)
    assert archive_key({"spark.app.name": "other"}, spark) == base  # what does not change the JVM does not count
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "a.jar").write_bytes(b"x")
    one = archive_key({}, jars)
    (jars / "a.jar").write_bytes(b"xy")  # the same jar, another build
    two = archive_key({}, jars)
    assert one is not None and two not in (None, one, base)
    os.utime(jars / "a.jar", ns=(1, 10**18))  # the same bytes installed again: the JVM refuses the archive
    assert archive_key({}, jars) not in (None, one, two)
    moved = tmp_path / "elsewhere" / "jars"
    moved.mkdir(parents=True)
    (moved / "a.jar").write_bytes(b"xy")
    assert archive_key({}, moved) not in (None, two)  # the same jars in another place (a new venv)
    assert archive_key({}, tmp_path / "none") is None
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert archive_key({}, spark) is None


def test_a_run_writes_under_a_temporary_name_then_uses_it(tmp_path: Path) -> None:
    found = class_archive.class_archive(str(tmp_path), {}, _spark_jars())
    assert found is not None and found.writing == tmp_path / f"{found.path.name}.tmp-{os.getpid()}"
    assert found.java_option() == f"-XX:ArchiveClassesAtExit={found.writing}"
    found.path.write_bytes(b"archive")
    os.utime(found.path, ns=(10**9, 10**9))
    again = class_archive.class_archive(str(tmp_path), {}, _spark_jars())
    assert again == ClassArchive(found.path, None)
    assert found.path.stat().st_mtime_ns > 10**9  # used now: the newest, so the last to go
    assert again.java_option() == f"-XX:SharedArchiveFile={found.path}"
    assert class_archive.class_archive("", {}, _spark_jars()) is None


def test_finish_waits_for_the_process_to_write_at_exit_and_renames(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-k.jsa", tmp_path / "spark-k.jsa.tmp-1")
    # As the JVM does: it writes its archive once its standard input closes and it exits.
    writer = textwrap.dedent(
        f"""
        import sys, time
        sys.stdin.read()
        time.sleep(0.2)
        open({str(archive.writing)!r}, "wb").write(b"classes")
        """
    )
    jvm = subprocess.Popen([sys.executable, "-c", writer], stdin=subprocess.PIPE)
    archive.finish(jvm)
    assert jvm.returncode == 0
    assert archive.path.read_bytes() == b"classes" and not archive.writing.exists()  # type: ignore[union-attr]


def test_a_failed_write_costs_the_archive_not_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    archive = ClassArchive(tmp_path / "spark-k.jsa", tmp_path / "spark-k.jsa.tmp-1")
    jvm = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    archive.finish(jvm)  # it exits without writing one
    assert not archive.path.exists() and "no class archive kept" in caplog.text
    archive.writing.write_bytes(b"")  # type: ignore[union-attr]
    archive.finish(None)  # an empty one is not kept either
    assert not archive.path.exists() and not archive.writing.exists()  # type: ignore[union-attr]


def test_orphans_go_and_only_the_newest_archives_stay(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"spark-old.jsa.tmp-{dead.pid}"
    live = tmp_path / f"spark-old.jsa.tmp-{os.getpid()}"
    orphan.write_bytes(b"half")
    live.write_bytes(b"being written")
    for i, name in enumerate(["spark-a.jsa", "spark-b.jsa", "spark-c.jsa"]):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, ns=(i * 10**9, i * 10**9))
    class_archive._remove_orphans(tmp_path)
    assert not orphan.exists() and live.exists()  # a running writer's file stays
    class_archive._keep_newest(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.glob("spark-*.jsa")) == ["spark-b.jsa", "spark-c.jsa"]


def test_no_archive_with_too_little_space(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(class_archive, "MIN_FREE_BYTES", 1 << 62)
    assert class_archive.class_archive(str(tmp_path), {}, _spark_jars()) is None
    assert list(tmp_path.iterdir()) == []


def test_the_users_own_sharing_options_win(tmp_path: Path) -> None:
    conf = {"spark.driver.extraJavaOptions": "-Xshare:off -Xss4m"}
    assert _with_class_archive(conf, str(tmp_path)) is None
    assert conf == {"spark.driver.extraJavaOptions": "-Xshare:off -Xss4m"}
    conf = {"spark.driver.extraJavaOptions": "-Xss4m"}
    archive = _with_class_archive(conf, str(tmp_path))
    assert archive is not None and conf["spark.driver.extraJavaOptions"] == f"-Xss4m {archive.java_option()}"


SESSION = textwrap.dedent(
    """
    import sys
    from streamoffload.streaming.job.session import build_session, stop_session
    spark = build_session("local[1]", class_archive=sys.argv[1], extra_conf={
        "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[2]})
    assert spark.range(3).count() == 3
    stop_session(spark, on_write=lambda path: print("writing", path))
    """
)


def test_a_real_jvm_writes_the_archive_and_the_next_one_maps_its_classes(tmp_path: Path) -> None:
    def session(log: Path) -> str:
        done = subprocess.run(
            [sys.executable, "-c", SESSION, str(tmp_path / "jvm"), str(log)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    first = session(tmp_path / "first.log")
    archives = list((tmp_path / "jvm").glob("spark-*.jsa"))
    assert len(archives) == 1 and first.strip() == f"writing {archives[0]}"
    assert list((tmp_path / "jvm").glob("*.tmp-*")) == []
    assert session(tmp_path / "second.log") == ""  # nothing more to write
    # The second JVM loaded Spark's classes from the archive's top layer (the dynamic one), not from the jars
    # (lambdas are made at run time either way; a few classes the first run did not load come from the jars).
    log = (tmp_path / "second.log").read_text().splitlines()
    loads = [line for line in log if "org.apache.spark." in line and "$$Lambda" not in line]
    from_archive = [line for line in loads if line.endswith("source: shared objects file (top)")]
    assert len(loads) > 1000 and len(from_archive) > 0.95 * len(loads)
