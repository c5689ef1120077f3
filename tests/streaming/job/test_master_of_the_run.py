"""The spool and the rate limits' shared budget follow the master the session runs on: under spark-submit
``--master yarn`` the configuration's ``[spark] master`` (default ``local[2]``) says nothing about where tasks run."""

from __future__ import annotations

from pathlib import Path

from streamoffload.config import load_config
from streamoffload.streaming.job.offload_job import OffloadJob

CONF = """\
[pulsar]
serviceUrl = "pulsar://127.0.0.1:1"
topics = ["persistent://public/default/t"]

[store]
managedLedgerOffloadDriver = "filesystem"
root = "{root}"

[spark]
checkpoint = "{checkpoint}"
"""


def test_spool_and_budget_follow_the_sessions_master(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(CONF.format(root=tmp_path / "store", checkpoint=tmp_path / "cp"), encoding="utf-8")
    config = load_config(str(path))
    assert config.spark.master == "local[2]"
    job = OffloadJob(config, str(path))
    job.begin_run()
    try:
        assert job.run is not None
        spool = str(tmp_path / "cp" / f"spool-{job.run.epoch:08d}")
        budget = str(tmp_path / "cp" / "rate-budget")
        assert job.source_options()["spoolDir"] == spool  # before a query: [spark] master
        spec = job.rate_limit_spec()
        assert spec is not None and spec.budget_dir == budget
        for master in ("yarn", "spark://10.0.0.1:7077", "k8s://https://10.0.0.1:6443"):
            job.spark_master = master  # what build() learns from spark.sparkContext.master
            assert "spoolDir" not in job.source_options()
            spec = job.rate_limit_spec()
            assert spec is not None and spec.budget_dir is None
        job.spark_master = "local-cluster[2,1,1024]"  # executors on this machine: the files reach them
        assert job.source_options()["spoolDir"] == spool
    finally:
        job.end_run()
