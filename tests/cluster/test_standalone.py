"""The job under ``spark-submit`` on a real Spark standalone cluster (a master and two workers, each its own JVM
and Python workers), submitted with README's "Spark standalone" commands as written: publish with pulsar-client,
SIGKILL one worker (with its executor) mid-run, then the driver, submit again (``run --once``: recovery from the
store, then drain and seal), and read every message back byte for byte. On a cluster there is no spool: the sink
reads every entry from the broker again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.spark_cluster import StandaloneCluster, StandaloneRecipe, poll, submit_command
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.produce import expected_key, expected_payload, expected_properties, produce
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import fs_store, write_config
from tests.fixtures.readback import read_messages

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

QUICK_SEALS = """
[offload]
managedLedgerOffloadMaxBlockSizeInBytes = 8192
maxSizePerOffloadSegmentMbytes = 0.03
maxOffloadSegmentRolloverTimeSeconds = 2
"""

FIRST, SECOND = 300, 200
"""Messages per topic published before the first submission, and after the worker's kill."""
TIMEOUT_S = 600.0
"""Bounds on waits for a loaded 2-core machine; each wait polls its condition."""


def submit(command: str, submit_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """README's submit block in ``submit_dir``, its own process group (the driver: spark-submit's JVM and Python)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and "PYSPARK" not in k}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver on loopback, beside the cluster
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["bash", "-euc", command],
            cwd=submit_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def check_topic(scoped: ScopedStore, topic: str) -> None:
    """Both publications exactly once, in order, byte for byte (each numbered its messages from 0)."""
    got = read_messages(scoped, topic)
    expected = [*range(FIRST), *range(SECOND)]
    assert len(got) == len(expected), f"{topic}: {len(got)} messages offloaded, {len(expected)} published"
    positions = [(m.ledger_id, m.entry_id, m.batch_index) for m in got]
    assert positions == sorted(positions) and len(set(positions)) == len(got)
    for i, (message, seq) in enumerate(zip(got, expected, strict=True)):
        assert message.payload == expected_payload(topic, seq, 150), (topic, i)
        assert message.key == expected_key(seq, 5)
        assert message.properties == expected_properties(seq)


def offloaded_entries(store: FilesystemStore, topics: list[str]) -> int:
    meta = MetadataStore(ScopedStore(store))
    return sum(m.entries for topic in topics for m in meta.offloaded_segments(topic))


def test_the_submitted_job_is_exact_across_a_worker_kill_and_a_driver_kill(
    spark_cluster: StandaloneCluster,
    cluster_environment: Path,
    cluster_recipe: StandaloneRecipe,
    pulsar_broker: Any,
    tmp_path: Path,
) -> None:
    topics = [unique_topic("cluster-batched"), unique_topic("cluster-plain")]

    def publish(count: int) -> None:
        produce(pulsar_broker.service_url, topics[0], count, 150, keys=5, batching=True, batch_size=10)
        produce(pulsar_broker.service_url, topics[1], count, 150, keys=5, batching=False)

    publish(FIRST)
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    for name in ("env", "env.tar.gz"):
        (submit_dir / name).symlink_to(cluster_environment / name)
    config = write_config(tmp_path, pulsar_broker.service_url, topics, fs_store(tmp_path), QUICK_SEALS)
    config.rename(submit_dir / "streamoffload.toml")
    store = FilesystemStore(tmp_path / "store")

    first_log = tmp_path / "driver-1.log"
    driver = submit(submit_command(cluster_recipe, spark_cluster.master_url), submit_dir, first_log)
    try:
        # Mid-run: segments committed while worker 0's executor works; then the worker goes, executor and all.
        poll(lambda: spark_cluster.executor_pids(0), TIMEOUT_S, "an executor on worker 0")
        poll(lambda: offloaded_entries(store, topics) > 0, TIMEOUT_S, "a first committed segment")
        spark_cluster.kill_worker(0)
        publish(SECOND)
        at_kill = offloaded_entries(store, topics)
        poll(lambda: offloaded_entries(store, topics) > at_kill, TIMEOUT_S, "commits on the remaining worker")
        assert driver.poll() is None, first_log.read_text(errors="replace")[-3000:]
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver: spark-submit's JVM and the job's Python
        driver.wait()
    # The driver saw the executor go with its worker (Spark numbers executors as they register: not the worker's
    # index) and went on with the other; the lost executor's state store partitions were loaded there.
    assert re.search(r"Lost executor \d+ on 127\.0\.0\.1: worker lost", first_log.read_text(errors="replace"))

    second_log = tmp_path / "driver-2.log"
    again = submit(submit_command(cluster_recipe, spark_cluster.master_url, once=True), submit_dir, second_log)
    try:
        assert again.wait(TIMEOUT_S) == 0, second_log.read_text(errors="replace")[-5000:]
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait()

    for topic in topics:
        check_topic(ScopedStore(store), topic)
    # The re-read path: the job knew it ran on a cluster (spark-submit's master), so no source task spooled.
    assert not list((tmp_path / "checkpoint").glob("spool-*")), sorted((tmp_path / "checkpoint").iterdir())
