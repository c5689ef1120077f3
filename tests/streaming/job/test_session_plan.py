"""The settings the session builder makes on each kind of master (``session_plan``), without starting Spark: what
the job sets, what it leaves to Spark or the user, and the local-only tricks kept local."""

from __future__ import annotations

import pytest

from streamoffload.errors import StreamOffloadError
from streamoffload.streaming.job.masters import MasterKind, parse_master
from streamoffload.streaming.job.session import (
    SMALL_BUFFERS,
    driver_java_options,
    executor_cores,
    session_plan,
)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
EVERYWHERE = {
    "spark.app.name": "streamoffload",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
}
DAEMON = {"spark.python.daemon.module": "streamoffload.streaming.runtime.worker_daemon"}


def test_local_master_gets_the_local_tricks():
    plan = session_plan("local[2]")
    assert plan.conf == {
        **EVERYWHERE,
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        **SMALL_BUFFERS,
        "spark.master": "local[2]",
        "spark.driver.memory": "2g",
        "spark.driver.extraJavaOptions": driver_java_options(""),
        **DAEMON,
    }
    assert plan.master.kind is MasterKind.LOCAL
    assert plan.worker_tricks and plan.master.single_jvm and not plan.shuffle_from_parallelism


def test_local_shuffle_partitions_follow_the_threads():
    assert session_plan("local[6]").conf["spark.sql.shuffle.partitions"] == "6"
    assert session_plan("local").conf["spark.sql.shuffle.partitions"] == "1"
    assert session_plan("local[3,2]").conf["spark.sql.shuffle.partitions"] == "3"


def test_local_cluster_keeps_the_ui_and_the_worker_tricks_not_the_jvm_options():
    plan = session_plan("local-cluster[2,3,1024]", work_dir="/w")
    assert plan.conf == {
        **EVERYWHERE,
        "spark.sql.shuffle.partitions": "6",  # 2 executors x 3 cores
        "spark.master": "local-cluster[2,3,1024]",
        "spark.driver.memory": "2g",
        "spark.sql.warehouse.dir": "/w/warehouse",
        "spark.local.dir": "/w/local",
        **DAEMON,
    }
    assert plan.master.kind is MasterKind.LOCAL_CLUSTER and plan.worker_tricks and not plan.master.single_jvm


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://10.0.0.1:6443"])
def test_cluster_masters_keep_spark_ui_and_get_no_local_tricks(master):
    plan = session_plan(master, work_dir="/w")
    assert plan.conf == {
        **EVERYWHERE,
        "spark.master": master,
        "spark.driver.memory": "2g",
        "spark.sql.warehouse.dir": "/w/warehouse",  # no spark.local.dir: a path on the driver's machine
    }
    assert plan.master.kind is MasterKind.CLUSTER
    assert not plan.worker_tricks and not plan.master.on_this_machine
    assert plan.shuffle_from_parallelism  # nothing says the executors' cores: defaultParallelism once up


def test_cluster_shuffle_partitions_from_the_executors_or_the_user():
    executors = {"spark.executor.instances": "4", "spark.executor.cores": "3"}
    plan = session_plan("yarn", user=executors)
    assert plan.conf["spark.sql.shuffle.partitions"] == "12" and not plan.shuffle_from_parallelism
    standalone = session_plan("spark://m:7077", user={"spark.cores.max": "8"})
    assert standalone.conf["spark.sql.shuffle.partitions"] == "8"
    mine = session_plan("k8s://https://k:6443", user={**executors, "spark.sql.shuffle.partitions": "40"})
    assert mine.conf["spark.sql.shuffle.partitions"] == "40" and not mine.shuffle_from_parallelism
    assert executor_cores({**executors, "spark.dynamicAllocation.enabled": "true"}) is None
    assert executor_cores({"spark.executor.instances": "x", "spark.executor.cores": "2"}) is None


def test_under_spark_submit_the_submitted_conf_wins_and_says_the_master():
    submitted = {
        "spark.master": "yarn",
        "spark.app.name": "offload-prod",
        "spark.ui.enabled": "false",
        "spark.executor.instances": "2",
        "spark.executor.cores": "2",
    }
    plan = session_plan("local[2]", submitted=submitted)  # [spark] master left at its default
    assert plan.conf == {key: value for key, value in EVERYWHERE.items() if key != "spark.app.name"} | {
        "spark.sql.shuffle.partitions": "4"
    }
    assert plan.master.kind is MasterKind.CLUSTER and plan.submitted and not plan.worker_tricks
    local = session_plan("yarn", submitted={"spark.master": "local[4]"})
    assert local.conf["spark.ui.enabled"] == "false" and local.conf["spark.sql.shuffle.partitions"] == "4"
    assert "spark.driver.extraJavaOptions" not in local.conf and "spark.master" not in local.conf
    assert not local.worker_tricks  # the JVM is up: it would not see the fork server nor the launcher


def test_user_settings_win_on_every_master():
    user = {"spark.ui.enabled": "true", "spark.sql.shuffle.partitions": "16", "spark.driver.memory": "1g"}
    plan = session_plan("local[2]", user=user)
    assert {key: plan.conf[key] for key in user} == user
    assert plan.conf["spark.driver.extraJavaOptions"] == driver_java_options("", "1g")
    assert session_plan("yarn", user={"spark.ui.enabled": "false"}).conf["spark.ui.enabled"] == "false"


def test_master_strings():
    assert parse_master("local[*]").cores is not None and parse_master("local[*]").kind is MasterKind.LOCAL
    assert parse_master(" local[2] ").url == "local[2]"
    assert parse_master("mesos://m:5050").kind is MasterKind.CLUSTER
    with pytest.raises(StreamOffloadError, match=r"Spark master 'local\[two\]': expected local"):
        parse_master("local[two]")
