"""Pulsar's names in the configuration file (``streamoffload.pulsar_names``): driver names without case,
broker.conf's store keys and OffloadPolicies' field names as aliases of ours, the file's camelCase with the
older spellings kept, a key given under two names refused naming both, and suggestions only for a near miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload.config import load_config, parse_config
from streamoffload.errors import ConfigError
from streamoffload.pulsar_names import ALIASES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("written", "driver"),
    [("S3", "s3"), ("AWS-S3", "aws-s3"), ("aws-s3", "aws-s3"), ("FileSystem", "filesystem"), ("s3", "s3")],
)
def test_driver_names_are_matched_without_case(written: str, driver: str) -> None:
    store = parse_config({"store": {"managedLedgerOffloadDriver": written, "bucket": "b"}}).store
    assert store.managedLedgerOffloadDriver == driver
    assert store.location.scheme == ("file" if driver == "filesystem" else "s3")


def test_an_unknown_driver_is_refused_naming_the_choices() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^<config>: store.managedLedgerOffloadDriver must be one of filesystem, "
        r"aws-s3, s3 \(any case, as in Pulsar: \"S3\" is s3\), got 'google-cloud-storage'$",
    ):
        parse_config({"store": {"managedLedgerOffloadDriver": "google-cloud-storage"}})


def test_a_broker_conf_offload_block_configures_the_store() -> None:
    """broker.conf's S3 offloader keys, as an operator pastes them into [store]."""
    store = parse_config(
        {
            "store": {
                "managedLedgerOffloadDriver": "S3",
                "s3ManagedLedgerOffloadBucket": "offload",
                "s3ManagedLedgerOffloadRegion": "eu-west-1",
                "s3ManagedLedgerOffloadServiceEndpoint": "http://127.0.0.1:9000",
            }
        }
    ).store
    assert (store.managedLedgerOffloadDriver, store.bucket, store.region, store.serviceEndpoint) == (
        "s3",
        "offload",
        "eu-west-1",
        "http://127.0.0.1:9000",
    )
    neutral = parse_config(
        {
            "store": {
                "managedLedgerOffloadDriver": "aws-s3",
                "managedLedgerOffloadBucket": "b2",
                "managedLedgerOffloadRegion": "us-east-1",
                "managedLedgerOffloadServiceEndpoint": "https://s3.us-east-1.amazonaws.com",
            }
        }
    ).store
    assert (neutral.bucket, neutral.region, neutral.serviceEndpoint) == (
        "b2",
        "us-east-1",
        "https://s3.us-east-1.amazonaws.com",
    )


def test_file_system_uri_is_the_filesystem_root(tmp_path: Path) -> None:
    store = parse_config({"store": {"fileSystemURI": f"file://{tmp_path}/offload"}}).store
    assert store.location.path == f"{tmp_path}/offload"
    path = tmp_path / "c.toml"
    path.write_text('[store]\nmanagedLedgerOffloadDriver = "filesystem"\nfileSystemURI = "store"\n')
    assert load_config(path).store.root == str(tmp_path / "store")  # a path: relative to the file, as root is
    with pytest.raises(
        ConfigError,
        match=r"store.fileSystemURI 'hdfs://nn:9000/offload': the filesystem store is a "
        r"local directory \(file:///dir or a path\); Pulsar's HDFS offloader's URIs are not a store",
    ):
        parse_config({"store": {"fileSystemURI": "hdfs://nn:9000/offload"}})


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("fileSystemProfilePath", "is the Hadoop configuration of Pulsar's HDFS offloader"),
        ("s3ManagedLedgerOffloadCredentialSecret", "credentials come from the AWS chain"),
    ],
)
def test_pulsar_store_keys_without_a_meaning_here_are_refused_naming_why(key: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"^<config>: store.{key} is not supported: it {why}") as err:
        parse_config({"store": {key: "s3cr3t-value"}})
    assert "s3cr3t-value" not in str(err.value)


def test_offload_policy_names_are_aliases_of_ours() -> None:
    config = parse_config(
        {
            "offload": {
                "managedLedgerOffloadDeletionLagInMillis": 600000,
                "s3ManagedLedgerOffloadMaxBlockSizeInBytes": "32MiB",
                "s3ManagedLedgerOffloadReadBufferSizeInBytes": 2097152,
            },
            "namespaces": {"acme/paused": {"managedLedgerOffloadThresholdInBytes": -1}},
            "topics": {"persistent://acme/paused/hot": {"managedLedgerOffloadAutoTriggerSizeThresholdBytes": 0}},
        }
    )
    policy = config.policy_for("persistent://public/default/t")
    assert (
        policy.managedLedgerOffloadDeletionLagMs,
        policy.managedLedgerOffloadMaxBlockSizeInBytes,
        policy.managedLedgerOffloadReadBufferSizeInBytes,
        policy.enabled,
    ) == (600000, 32 << 20, 2 << 20, True)
    assert config.policy_for("persistent://acme/paused/cold").enabled is False
    assert config.policy_for("persistent://acme/paused/hot-partition-0").enabled is True
    assert parse_config({"offload": {"managedLedgerOffloadDeletionLagInMillis": "2h"}}).broker_policy == {
        "managedLedgerOffloadDeletionLagMs": 7_200_000
    }


def test_a_positive_offload_threshold_is_refused_saying_what_it_would_mean() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^<config>: offload.managedLedgerOffloadThresholdInBytes = 1073741824 is Pulsar's size of a topic's "
        r"data kept on BookKeeper before automatic offload; this job offloads every entry continuously",
    ):
        parse_config({"offload": {"managedLedgerOffloadThresholdInBytes": 1 << 30}})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"store": {"bucket": "a", "s3ManagedLedgerOffloadBucket": "b"}},
            r"store.bucket and store.s3ManagedLedgerOffloadBucket are one setting \(store.bucket\): give one of them",
        ),
        (
            {"store": {"s3ManagedLedgerOffloadRegion": "a", "managedLedgerOffloadRegion": "a"}},
            r"store.s3ManagedLedgerOffloadRegion and store.managedLedgerOffloadRegion are one setting \(store.region\)",
        ),
        (
            {"pulsar": {"service_url": "pulsar://a:6650", "serviceUrl": "pulsar://b:6650"}},
            r"pulsar.service_url and pulsar.serviceUrl are one setting \(pulsar.serviceUrl\): give one of them",
        ),
        (
            {
                "namespaces": {
                    "a/b": {"managedLedgerOffloadDeletionLagMs": 1, "managedLedgerOffloadDeletionLagInMillis": 2}
                }
            },
            r"namespaces.'a/b'.managedLedgerOffloadDeletionLagMs and namespaces.'a/b'."
            r"managedLedgerOffloadDeletionLagInMillis both set managedLedgerOffloadDeletionLagMs: give one of them",
        ),
        (
            {"offload": {"enabled": True, "managedLedgerOffloadThresholdInBytes": -1}},
            r"offload.enabled and offload.managedLedgerOffloadThresholdInBytes both set enabled",
        ),
    ],
)
def test_one_key_under_two_names_is_refused_naming_both(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^<config>: {message}"):
        parse_config(doc)


def test_store_keys_in_a_policy_table_are_sent_to_store() -> None:
    for key in ("s3ManagedLedgerOffloadBucket", "managedLedgerOffloadDriver", "fileSystemURI"):
        with pytest.raises(ConfigError, match=rf"^<config>: offload.{key} is a store setting: set it in \[store\]"):
            parse_config({"offload": {key: "x"}})


def test_the_house_style_is_camel_case_and_the_old_spellings_still_load() -> None:
    house = parse_config(
        {
            "pulsar": {
                "serviceUrl": "pulsar://b:6650",
                "topicsPattern": "acme/orders/.*",
                "startingOffsets": "latest",
                "maxBytesPerTrigger": "256MiB",
                "maxEntriesPerTrigger": 1000,
                "failOnDataLoss": False,
                "watchQuietTopics": False,
                "retainSubscription": "keep",
                "maxMessageSize": "1MiB",
            },
            "spark": {"triggerInterval": "2 seconds"},
            "metrics": {"topicSeries": 7},
            "store": {"pathStyle": True, "managedLedgerOffloadDriver": "s3", "bucket": "b"},
        }
    )
    old = parse_config(
        {
            "pulsar": {
                "service_url": "pulsar://b:6650",
                "topics_pattern": "acme/orders/.*",
                "starting_offsets": "latest",
                "max_bytes_per_trigger": "256MiB",
                "max_entries_per_trigger": 1000,
                "fail_on_data_loss": False,
                "watch_quiet_topics": False,
                "retain_subscription": "keep",
                "max_message_size": "1MiB",
            },
            "spark": {"trigger_interval": "2 seconds"},
            "metrics": {"topic_series": 7},
            "store": {"pathStyle": True, "managedLedgerOffloadDriver": "s3", "bucket": "b"},
        }
    )
    assert house == old
    assert (house.pulsar.service_url, house.pulsar.max_bytes_per_trigger, house.pulsar.max_message_size) == (
        "pulsar://b:6650",
        256 << 20,
        1 << 20,
    )
    assert (house.spark.trigger_interval, house.metrics.topic_series, house.store.pathStyle) == ("2 seconds", 7, True)


def test_the_shipped_file_is_written_in_the_house_style_only() -> None:
    """conf/streamoffload.toml: every key, set or commented out, camelCase (Pulsar's and the sources' style)."""
    import re

    text = (REPO / "conf" / "streamoffload.toml").read_text()
    # [pulsar.client] passes pulsar-client's own (snake_case) argument names on as they are.
    client = text.index("[pulsar.client]")
    text = text[:client] + text[text.index("\n[", client + 1) :]
    keys = re.findall(r"^#?\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", text, re.M)
    assert "serviceUrl" in keys and "keysFile" in keys and "triggerInterval" in keys
    assert [k for k in keys if "_" in k] == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"store": {"s3ManagedLedgerOffloadBuckett": "b"}},
            "unknown key store.s3ManagedLedgerOffloadBuckett "
            r"\(did you mean 's3ManagedLedgerOffloadBucket'\?\)$",
        ),
        ({"metrics": {"topic_serie": 1}}, r"unknown key metrics.topic_serie \(did you mean 'topic_series'\?\)$"),
        ({"pulsar": {"serviceURL": "x"}}, r"unknown key pulsar.serviceURL \(did you mean 'serviceUrl'\?\)$"),
        # Not close: no suggestion (it once said "did you mean 'managedLedgerOffloadDriver'?").
        (
            {"offload": {"gcsManagedLedgerOffloadBucket": "b"}},
            "unknown offload policy key offload.gcsManagedLedgerOffloadBucket$",
        ),
        ({"store": {"offloadersDirectory": "./offloaders"}}, "unknown key store.offloadersDirectory$"),
    ],
)
def test_suggestions_only_for_a_near_miss(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^<config>: {message}"):
        parse_config(doc)


def test_every_alias_is_documented_in_readme_and_the_shipped_file() -> None:
    readme = (REPO / "README.md").read_text()
    shipped = (REPO / "conf" / "streamoffload.toml").read_text()
    missing = [a.name for a in ALIASES if f"`{a.name}`" not in readme or a.name not in shipped]
    assert missing == []
