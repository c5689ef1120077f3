"""The data sources of a session ``build_session`` builds: streamoffload's, registered by name, and none of the
``pyspark_*`` packages Spark would otherwise look up in a Python worker at the first registration."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SESSION = textwrap.dedent(
    """
    import sys
    from streamoffload.streaming.job.session import build_session, stop_session

    spark = build_session(master="local[1]", work_dir=sys.argv[1])
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        print(*(manager.dataSourceExists(name) for name in ("pulsar-offloaded", "streamoffload-pulsar", "probe")))
    finally:
        stop_session(spark)
    """
)

PROBE = textwrap.dedent(
    """
    import pathlib
    from pyspark.sql.datasource import DataSource

    pathlib.Path(__file__).with_name("imported").write_text("looked up")


    class DefaultSource(DataSource):
        @classmethod
        def name(cls):
            return "probe"
    """
)


def test_the_session_registers_its_own_sources_and_looks_up_no_pyspark_packages(tmp_path: Path) -> None:
    """A ``pyspark_probe`` package on the workers' path is neither imported nor registered (Spark's lookup would
    import it: that lookup is a Python worker walking every module, 0.8-1.1 s of each run)."""
    package = tmp_path / "path" / "pyspark_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PROBE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "path"), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", SESSION, str(tmp_path / "spark")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "False"]
    assert not (package / "imported").exists()
