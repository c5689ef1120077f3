"""Spark's local Python workers: pyspark from site-packages (streaming/runtime/worker_python), and what they
import frozen out of the garbage collector's reach (streaming/runtime/worker_gc), and the JVM that starts them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from streamoffload.errors import ConfigError
from streamoffload.streaming.job.session import (
    G1_REGION,
    GC_TIME_GOAL,
    HEAP_FLOOR,
    JVM_ENVIRONMENT,
    PRE_TOUCH,
    QUICK_JIT,
    SMALL_BUFFERS,
    YOUNG_GEN,
    driver_java_options,
)
from streamoffload.streaming.runtime.worker_python import launcher_directory, worker_python


def test_the_launcher_drops_sparks_zips_and_jar_from_pythonpath_and_keeps_the_rest(tmp_path: Path) -> None:
    launcher = worker_python(str(tmp_path))
    path = "/s/python/lib/pyspark.zip:/a b/lib:/s/python/lib/py4j-0.10.9.9-src.zip:/c/*:/s/jars/spark-core_2.13.jar"
    result = subprocess.run(
        [launcher, "-c", "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable)"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == ["/a b/lib:/c/*", sys.executable]
    assert worker_python(str(tmp_path)) == launcher  # written once, then reused
    assert os.stat(launcher).st_mode & 0o777 == 0o700


def test_launchers_live_in_the_users_cache_not_the_temporary_directory(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert launcher_directory() == str(tmp_path / "cache" / "streamoffload")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # not a directory: the temporary one
    assert launcher_directory().startswith(tempfile.gettempdir())


def test_a_launcher_per_interpreter(tmp_path: Path) -> None:
    assert worker_python(str(tmp_path), "/usr/bin/python3") != worker_python(str(tmp_path), sys.executable)


def test_spark_python_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    def where(_rows: Any) -> Any:
        import pyspark

        yield pyspark.__file__

    import pyspark

    (found,) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found == pyspark.__file__ and ".zip" not in found  # the driver's own, from site-packages


def test_spark_python_workers_have_no_zip_or_jar_to_search_and_start_with_the_imports_done(spark: Any) -> None:
    """Every import and every task's ``invalidate_caches`` would read a zip's directory (streaming/worker_python);
    the daemon imported what tasks need before it forked them (streaming/worker_daemon)."""

    def look(_rows: Any) -> Any:
        import os
        import sys

        archives = [p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.exists(p)]
        yield (archives, sorted(m for m in ("pandas", "pyarrow", "crc32c") if m in sys.modules))

    ((archives, preloaded),) = spark.sparkContext.parallelize([0], 1).mapPartitions(look).collect()
    assert archives == []
    assert preloaded == ["crc32c", "pandas", "pyarrow"]


def test_a_worker_freezes_what_it_imported_once_so_the_daemons_collections_are_cheap(spark: Any) -> None:
    """Spark's daemon collects garbage after every task of a reused worker (see streaming/worker_gc)."""

    def frozen(_rows: Any) -> Any:
        import gc

        from streamoffload.streaming.runtime.worker_gc import freeze_long_lived

        freeze_long_lived()
        first = gc.get_freeze_count()
        freeze_long_lived()  # once per process
        yield (first, gc.get_freeze_count())

    ((first, again),) = spark.sparkContext.parallelize([0], 1).mapPartitions(frozen).collect()
    assert first > 10_000 and again == first


DRIVER = """
import gc, sys, tempfile
from streamoffload.streaming.job.session import build_session
session = build_session("local[1]", work_dir=tempfile.mkdtemp())
print(gc.get_freeze_count(), any(o is session for o in gc.get_objects()), flush=True)
session.stop()
"""


def test_the_driver_freezes_what_lives_once_its_session_is_built() -> None:
    """A job's driver: what exists once its SparkSession is built (the session among it) is out of the collector's
    reach, so a gen-2 collection walks only what came after (a process of its own: nothing froze before)."""
    done = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    count, session_collectable = done.stdout.split()
    assert int(count) > 10_000 and session_collectable == "False"


OURS_AFTER_JIT = f"{G1_REGION} {YOUNG_GEN} {HEAP_FLOOR} {PRE_TOUCH} {GC_TIME_GOAL}"


def test_the_local_jvm_compiles_with_c1_only_unless_the_user_chose_the_tiers() -> None:
    assert driver_java_options("") == f"{QUICK_JIT} {OURS_AFTER_JIT}"
    assert driver_java_options("-Dx=1") == f"{QUICK_JIT} {OURS_AFTER_JIT} -Dx=1"
    assert driver_java_options("-XX:TieredStopAtLevel=4") == f"{OURS_AFTER_JIT} -XX:TieredStopAtLevel=4"
    assert driver_java_options("-XX:-TieredCompilation") == f"{OURS_AFTER_JIT} -XX:-TieredCompilation"


def test_the_local_jvm_has_4_mb_regions_and_a_fixed_young_generation_unless_the_user_chose_them() -> None:
    floor = f"{HEAP_FLOOR} {PRE_TOUCH} {GC_TIME_GOAL}"
    assert driver_java_options("-XX:G1HeapRegionSize=8m") == f"{QUICK_JIT} {YOUNG_GEN} {floor} -XX:G1HeapRegionSize=8m"
    assert driver_java_options("-Xmn64m") == f"{QUICK_JIT} {G1_REGION} {floor} -Xmn64m"
    assert driver_java_options("-XX:MaxNewSize=1g") == f"{QUICK_JIT} {G1_REGION} {floor} -XX:MaxNewSize=1g"


def test_the_local_jvm_keeps_a_resident_heap_floor_unless_the_user_chose_one_or_the_heap_is_smaller() -> None:
    jit_regions_young = f"{QUICK_JIT} {G1_REGION} {YOUNG_GEN}"
    goal, initial = GC_TIME_GOAL, "-XX:InitialHeapSize=1g"
    assert driver_java_options("-Xms1g") == f"{jit_regions_young} {PRE_TOUCH} {goal} -Xms1g"
    assert driver_java_options(initial) == f"{jit_regions_young} {PRE_TOUCH} {goal} {initial}"
    assert driver_java_options("-XX:-AlwaysPreTouch") == f"{jit_regions_young} {HEAP_FLOOR} {goal} -XX:-AlwaysPreTouch"
    # A JVM with an initial heap above its maximum does not start: no floor under a smaller heap.
    assert driver_java_options("", "256m") == f"{jit_regions_young} {goal}"
    assert driver_java_options("", "300") == f"{jit_regions_young} {goal}"  # a bare number is MiB, as Spark reads it
    assert driver_java_options("", "384m") == f"{jit_regions_young} {HEAP_FLOOR} {PRE_TOUCH} {goal}"
    assert driver_java_options("", "8192") == f"{jit_regions_young} {HEAP_FLOOR} {PRE_TOUCH} {goal}"
    with pytest.raises(ConfigError, match=r"spark\.driver\.memory.*'two gigs'"):
        driver_java_options("", "two gigs")


def test_the_local_jvm_grows_its_heap_on_its_own_only_past_20_percent_of_time_in_gc_unless_the_user_chose() -> None:
    ours = f"{QUICK_JIT} {G1_REGION} {YOUNG_GEN} {HEAP_FLOOR} {PRE_TOUCH}"
    assert driver_java_options("-XX:GCTimeRatio=12") == f"{ours} -XX:GCTimeRatio=12"
    assert driver_java_options("") == f"{ours} {GC_TIME_GOAL}"


def test_the_sessions_jvm_runs_with_our_options_and_allocates_its_buffers_as_young_objects(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert {QUICK_JIT, G1_REGION, YOUNG_GEN, HEAP_FLOOR, PRE_TOUCH, GC_TIME_GOAL} <= set(runtime.getInputArguments())
    # A buffer is humongous for G1 from half a region on: every buffer Spark sizes per micro-batch stays below.
    region = int(
        jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
            jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
        )
        .getVMOption("G1HeapRegionSize")
        .getValue()
    )
    assert region == 4 * 1024 * 1024
    assert jvm.java.lang.System.getenv("MALLOC_ARENA_MAX") == JVM_ENVIRONMENT["MALLOC_ARENA_MAX"]
    # The floor's regions are committed and touched from the start, whatever G1 does later.
    heap = jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
    assert heap.getCommitted() >= 384 * 1024 * 1024
    conf = spark.sparkContext.getConf()
    for key in SMALL_BUFFERS:
        assert jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(conf.get(key)) < region // 2
