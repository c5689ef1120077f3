"""``streamoffload policy`` (the applied policy and where each value came from), the Pulsar source's
pulsar-spark option aliases, and topics_pattern_candidates from the configuration file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.commands.policy import applied_policy
from streamoffload.config import load_config
from streamoffload.errors import ConfigError
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.source.source_options import SourceOptions

CONF = """
[pulsar]
topics_pattern = "persistent://public/default/ord.*"
topics_pattern_candidates = ["orders", "ordinals"]
[offload]
maxSizePerOffloadSegmentMbytes = 256
[namespaces."public/default"]
maxOffloadSegmentRolloverTimeMinutes = 5
[topics."persistent://public/default/orders"]
method = "ledger"
[topics."persistent://public/default/orders-partition-1"]
enabled = false
"""


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "offload.toml"
    path.write_text(CONF)
    return path


def test_applied_policy_names_the_level_of_every_value(conf: Path) -> None:
    applied = applied_policy(load_config(conf), "persistent://public/default/orders-partition-1")
    assert applied["enabled"] == (False, "partition persistent://public/default/orders-partition-1")
    assert applied["method"] == ("ledger", "topic persistent://public/default/orders")
    assert applied["maxOffloadSegmentRolloverTimeMinutes"] == (5.0, "namespace public/default")
    assert applied["maxSizePerOffloadSegmentMbytes"] == (256.0, "broker")
    assert applied["managedLedgerOffloadMaxBlockSizeInBytes"][1] == "default"
    other = applied_policy(load_config(conf), "persistent://public/default/orders-partition-0")
    assert other["enabled"] == (True, "default")


def test_the_policy_command_prints_json_and_refuses_a_bad_topic(conf: Path) -> None:
    cmd = [sys.executable, "-m", "streamoffload", "policy", "--conf", str(conf)]
    out = subprocess.run([*cmd, "orders", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["method"] == {"value": "ledger", "level": "topic persistent://public/default/orders"}
    bad = subprocess.run([*cmd, "bad//topic"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "bad//topic" in bad.stderr


def test_pulsar_spark_option_names_are_accepted() -> None:
    options = SourceOptions.parse({"service.url": "pulsar://127.0.0.1:6650", "topic": "orders", "admin.url": "x"})
    assert options.service_url == "pulsar://127.0.0.1:6650"
    assert options.topics == ("persistent://public/default/orders",)
    with pytest.raises(ConfigError, match="topic or topics"):
        SourceOptions.parse({"serviceUrl": "pulsar://h:6650", "topic": "a", "topics": "b"})
    with pytest.raises(ConfigError, match=r"service\.url"):
        SourceOptions.parse({"topic": "a"})


def test_topics_pattern_candidates_come_from_the_file(conf: Path) -> None:
    options = OffloadJob(load_config(conf), str(conf)).source_options()
    assert options["topicsPatternCandidates"] == "orders,ordinals"
    parsed = SourceOptions.parse(options)
    assert parsed.pattern_candidates == ("persistent://public/default/orders", "persistent://public/default/ordinals")


def test_watching_quiet_topics_is_on_by_default_and_can_be_turned_off(conf: Path) -> None:
    """Off, the source holds no consumer between triggers, so Pulsar deletes a topic without --force."""
    assert "watchedPollSeconds" not in OffloadJob(load_config(conf), str(conf)).source_options()
    conf.write_text(CONF.replace("[pulsar]\n", "[pulsar]\nwatch_quiet_topics = false\n", 1))
    options = OffloadJob(load_config(conf), str(conf)).source_options()
    assert SourceOptions.parse(options).watched_poll_s == 0
    conf.write_text(CONF.replace("[pulsar]\n", '[pulsar]\nwatch_quiet_topics = "no"\n', 1))
    with pytest.raises(ConfigError, match=r"pulsar\.watch_quiet_topics"):
        load_config(conf)
