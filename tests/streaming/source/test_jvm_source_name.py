"""Beside a JVM source named ``pulsar`` (as pulsar-spark's jar registers one): ``register`` goes on with a
warning, ``format("pulsar")`` is the JVM source's (SPARK-46522, SPARK-50426) and ``streamoffload-pulsar`` ours.

The JVM source is compiled here (a ``DataSourceRegister`` whose short name is ``pulsar``, listed in
``META-INF/services`` as a connector jar lists its sources) and put on a Spark session's ``spark.jars``: its
own process, since the classpath is fixed when a session starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

JAVA_SOURCE = """package fake;

public class PulsarSource implements org.apache.spark.sql.sources.DataSourceRegister {
    @Override
    public String shortName() {
        return "pulsar";
    }
}
"""

SESSION = """
import sys
from pyspark.sql import SparkSession
from streamoffload.streaming import register

jar, service_url, topic = sys.argv[1:4]
spark = SparkSession.builder.master("local[1]").config("spark.jars", jar).config("spark.ui.enabled", "false")
spark = spark.getOrCreate()
register(spark)
frame = spark.read.format("streamoffload-pulsar").option("serviceUrl", service_url).option("topics", topic).load()
print("ours:", frame.columns[:4])
try:
    spark.read.format("pulsar").option("serviceUrl", service_url).option("topics", topic).load()
    print("pulsar: ours")
except Exception as err:
    print("pulsar:", str(err).splitlines()[0])
spark.stop()
"""


def fake_pulsar_jar(tmp: Path) -> Path:
    import pyspark

    spark_sql = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar"))  # DataSourceRegister
    (tmp / "src" / "fake").mkdir(parents=True)
    (tmp / "src" / "fake" / "PulsarSource.java").write_text(JAVA_SOURCE)
    services = tmp / "classes" / "META-INF" / "services"
    services.mkdir(parents=True)
    (services / "org.apache.spark.sql.sources.DataSourceRegister").write_text("fake.PulsarSource\n")
    classes = tmp / "classes"
    subprocess.run(
        ["javac", "-cp", str(spark_sql[-1]), "-d", str(classes), str(tmp / "src" / "fake" / "PulsarSource.java")],
        check=True,
    )
    jar = tmp / "fake-pulsar.jar"
    with zipfile.ZipFile(jar, "w") as out:
        for path in sorted(classes.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(classes).as_posix())
    return jar


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK's javac")
def test_beside_a_jvm_pulsar_source_ours_is_streamoffload_pulsar(tmp_path: Path) -> None:
    jar = fake_pulsar_jar(tmp_path)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = subprocess.run(
        [sys.executable, "-c", SESSION, str(jar), "pulsar://127.0.0.1:6650", "t"],  # planned, not read
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "ours: ['value', '__key', '__topic', '__messageId']" in lines
    assert "pulsar: pulsar is not a valid Spark SQL Data Source." in lines  # the JVM one, not ours
    assert "data source name 'pulsar' is taken by a built-in or JVM source" in run.stderr
