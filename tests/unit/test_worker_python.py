"""Spark's local Python workers import pyspark from site-packages, not from Spark's zip (streaming/worker_python)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from streamoffload.streaming.worker_python import worker_python


def test_the_launcher_drops_sparks_zips_from_pythonpath_and_keeps_the_rest(tmp_path: Path) -> None:
    launcher = worker_python(str(tmp_path))
    path = "/s/python/lib/pyspark.zip:/a b/lib:/s/python/lib/py4j-0.10.9.9-src.zip:/c/*"
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


def test_a_launcher_per_interpreter(tmp_path: Path) -> None:
    assert worker_python(str(tmp_path), "/usr/bin/python3") != worker_python(str(tmp_path), sys.executable)


def test_spark_python_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    def where(_rows: Any) -> Any:
        import pyspark

        yield pyspark.__file__

    import pyspark

    (found,) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert found == pyspark.__file__ and ".zip" not in found  # the driver's own, from site-packages
