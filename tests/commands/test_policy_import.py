"""``streamoffload policy import``: the JSON ``pulsar-admin namespaces|topics get-offload-policies`` prints, as
this file's TOML, loaded back through ``streamoffload.config`` unchanged.

The fixtures (``pulsar_json/``) are in the shape Pulsar prints: ``OffloadPoliciesImpl``'s fields in their
declared order, then its ``isS3Driver``/``isGcsDriver``/``isFileSystemDriver`` getters, written by
``ObjectMapperFactory``'s mapper (``Include.NON_NULL``: unset fields are left out) with Jackson's pretty
printer (``"key" : value``). ``namespace-aws-s3.json``: a namespace after ``set-offload-policies -d aws-s3``
with a bucket, region, endpoint, deletion lag, threshold 0 and its own block and read buffer sizes;
``topic-applied-filesystem.json``: ``topics get-offload-policies --applied`` on a broker whose broker.conf
offloads to the filesystem driver (threshold -1, broker.conf's default)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from streamoffload.commands.policy import import_toml, read_offload_policies, translate_offload_policies
from streamoffload.config import parse_config
from streamoffload.errors import ConfigError

JSON = Path(__file__).resolve().parent / "pulsar_json"
NAMESPACE = JSON / "namespace-aws-s3.json"
APPLIED = JSON / "topic-applied-filesystem.json"
# Captured from Apache Pulsar 4.0.7 standalone (pulsar_json/README.md;
# tests/pulsar/standalone/test_policy_import_pulsar.py).
PULSAR_NAMESPACE = JSON / "pulsar-4.0.7-namespace-aws-s3.json"
PULSAR_TOPIC = JSON / "pulsar-4.0.7-topic-filesystem.json"
PULSAR_APPLIED = JSON / "pulsar-4.0.7-topic-applied.json"
BROKER_SIDE = "the broker's own offloader (its NAR directory, threads, read-ahead); the job sizes its own work"


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamoffload", "policy", "import", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_namespace_policy_becomes_store_and_offload_sections_that_load_back_unchanged() -> None:
    imported = translate_offload_policies(read_offload_policies(str(NAMESPACE)))
    assert imported.store == {
        "managedLedgerOffloadDriver": "aws-s3",
        "bucket": "offload-bucket",
        "region": "eu-west-1",
        "serviceEndpoint": "https://s3.eu-west-1.amazonaws.com",
    }
    assert imported.policy == {
        "managedLedgerOffloadDeletionLagMs": 14400000,
        "managedLedgerOffloadMaxBlockSizeInBytes": 33554432,
        "managedLedgerOffloadReadBufferSizeInBytes": 2097152,
        "enabled": True,
    }
    text = import_toml(imported)
    assert text == (
        "[store]\n"
        'managedLedgerOffloadDriver = "aws-s3"\n'
        'bucket = "offload-bucket"\n'
        'region = "eu-west-1"\n'
        'serviceEndpoint = "https://s3.eu-west-1.amazonaws.com"\n'
        "\n"
        "[offload]\n"
        "managedLedgerOffloadDeletionLagMs = 14400000\n"
        "managedLedgerOffloadMaxBlockSizeInBytes = 33554432\n"
        "managedLedgerOffloadReadBufferSizeInBytes = 2097152\n"
        "enabled = true\n"
    )
    config = parse_config(tomllib.loads(text), "imported")
    store = config.store
    assert (store.managedLedgerOffloadDriver, store.bucket, store.region, store.serviceEndpoint) == (
        "aws-s3",
        "offload-bucket",
        "eu-west-1",
        "https://s3.eu-west-1.amazonaws.com",
    )
    assert dict(config.broker_policy) == imported.policy
    # The driver-neutral fields win over the s3 ones (as in Pulsar); where they differ, the s3 one is named.
    broker_side = "the broker's own offloader (its NAR directory, threads, read-ahead); the job sizes its own work"
    gcs = "Google Cloud Storage is not a store this job writes (filesystem, aws-s3, s3)"
    assert imported.skipped == [
        ("fileSystemDriver", "derived from managedLedgerOffloadDriver"),
        ("gcsDriver", "derived from managedLedgerOffloadDriver"),
        ("gcsManagedLedgerOffloadMaxBlockSizeInBytes", gcs),
        ("gcsManagedLedgerOffloadReadBufferSizeInBytes", gcs),
        ("managedLedgerExtraConfigurations", "extra settings of the broker's own offloader"),
        ("managedLedgerOffloadMaxThreads", broker_side),
        ("managedLedgerOffloadPrefetchRounds", broker_side),
        (
            "managedLedgerOffloadedReadPriority",
            "the broker's choice of where to read; readers here read the store wherever it holds an entry",
        ),
        ("offloadersDirectory", broker_side),
        ("s3Driver", "derived from managedLedgerOffloadDriver"),
        (
            "s3ManagedLedgerOffloadMaxBlockSizeInBytes",
            "67108864, but managedLedgerOffloadMaxBlockSizeInBytes = 33554432 wins (the driver-neutral field, as in "
            "Pulsar)",
        ),
        (
            "s3ManagedLedgerOffloadReadBufferSizeInBytes",
            "1048576, but managedLedgerOffloadReadBufferSizeInBytes = 2097152 wins (the driver-neutral field, as in "
            "Pulsar)",
        ),
        ("s3ManagedLedgerOffloadRoleSessionName", "credentials come from the AWS chain (environment, profile, role)"),
    ]


def test_into_a_namespace_section_the_store_fields_are_named_not_imported() -> None:
    result = cli(str(NAMESPACE), "--namespace", "acme/orders")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        '[namespaces."acme/orders"]\n'
        "managedLedgerOffloadDeletionLagMs = 14400000\n"
        "managedLedgerOffloadMaxBlockSizeInBytes = 33554432\n"
        "managedLedgerOffloadReadBufferSizeInBytes = 2097152\n"
        "enabled = true\n"
    )
    lines = result.stderr.splitlines()
    for name in ("managedLedgerOffloadDriver", "s3ManagedLedgerOffloadBucket", "managedLedgerOffloadBucket"):
        assert (
            f"streamoffload policy import: not imported: {name}: a store setting: one store per job, in [store]"
            in lines
        )
    config = parse_config(tomllib.loads(result.stdout), "imported")
    policy = config.policy_for("persistent://acme/orders/t-partition-0")
    assert (policy.managedLedgerOffloadDeletionLagMs, policy.block_size, policy.enabled) == (14400000, 33554432, True)
    assert config.policy_for("persistent://other/ns/t").block_size == 64 * 1024 * 1024  # the namespace's only


def test_an_applied_filesystem_policy_from_stdin_into_a_topic_section() -> None:
    result = cli("-", "--topic", "acme/orders/big", stdin=APPLIED.read_text())
    assert result.returncode == 0, result.stderr
    # Pulsar prints its s3 block and read buffer defaults whatever the driver: not the filesystem driver's.
    assert result.stdout == (
        '[topics."persistent://acme/orders/big"]\nmanagedLedgerOffloadDeletionLagMs = 600000\nenabled = false\n'
    )
    for name in ("s3ManagedLedgerOffloadMaxBlockSizeInBytes", "s3ManagedLedgerOffloadReadBufferSizeInBytes"):
        assert (
            f"streamoffload policy import: not imported: {name}: not used by the filesystem driver (Pulsar prints "
            "it anyway)" in result.stderr.splitlines()
        )
    assert (
        "streamoffload policy import: not imported: fileSystemURI: a store setting: one store per job, in [store]"
        in result.stderr.splitlines()
    )
    assert "note: managedLedgerOffloadThresholdInBytes = -1 (Pulsar: no automatic offload) is imported as " in (
        result.stderr
    )
    policy = parse_config(tomllib.loads(result.stdout)).policy_for("persistent://acme/orders/big-partition-1")
    assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs) == (False, 600000)


def test_an_applied_filesystem_policy_gives_the_store_root_and_names_the_hadoop_profile() -> None:
    result = cli(str(APPLIED))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        '[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "/var/lib/pulsar/offload"\n'
    )
    assert (
        "streamoffload policy import: not imported: fileSystemProfilePath: is the Hadoop configuration of Pulsar's "
        "HDFS offloader;" in result.stderr
    )
    config = parse_config(tomllib.loads(result.stdout))
    assert config.store.location.path == "/var/lib/pulsar/offload"


def test_a_value_our_rules_refuse_is_said_at_import_naming_the_key() -> None:
    # Pulsar allows 5 MB blocks; here a block must hold the broker's largest entry (5 MiB + framing).
    result = cli("-", stdin='{"managedLedgerOffloadMaxBlockSizeInBytes" : 5242880, "hdfsThing" : 1}')
    assert result.returncode == 1
    assert result.stdout == ""
    assert "managedLedgerOffloadMaxBlockSizeInBytes = 5242880 cannot hold the largest entry" in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("null", "expected the JSON object get-offload-policies prints, got 'null'"),
        ("{", "not get-offload-policies JSON"),
        ('{"managedLedgerOffloadDeletionLagInMillis": NaN}', "NaN is not a number JSON allows"),
    ],
)
def test_what_is_not_a_policy_document_is_one_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}: .*{message}"):
        read_offload_policies(str(path))


def test_unknown_fields_and_positive_thresholds_are_named() -> None:
    imported = translate_offload_policies(
        {"managedLedgerOffloadThresholdInBytes": 10 << 30, "offloadFoo": 1, "gcsManagedLedgerOffloadBucket": "b"}
    )
    assert imported.policy == {} and imported.store == {}
    assert [name for name, _ in imported.skipped] == [
        "gcsManagedLedgerOffloadBucket",
        "managedLedgerOffloadThresholdInBytes",
        "offloadFoo",
    ]
    assert imported.skipped[1][1].startswith("10737418240 is Pulsar's size of a topic's data kept on BookKeeper")
    assert imported.skipped[2][1] == "not a field of Pulsar's OffloadPolicies"


def test_a_real_brokers_namespace_policy_configures_the_store_and_policy_exactly() -> None:
    result = cli(str(PULSAR_NAMESPACE))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[store]\n"
        'managedLedgerOffloadDriver = "aws-s3"\n'
        'bucket = "offload-bucket"\n'
        'region = "eu-west-1"\n'
        'serviceEndpoint = "https://s3.eu-west-1.amazonaws.com"\n'
        "\n"
        "[offload]\n"
        "managedLedgerOffloadDeletionLagMs = 14400000\n"
        "managedLedgerOffloadMaxBlockSizeInBytes = 33554432\n"
        "managedLedgerOffloadReadBufferSizeInBytes = 2097152\n"
        "enabled = true\n"
    )
    config = parse_config(tomllib.loads(result.stdout), "imported")
    assert (config.store.location.scheme, config.store.bucket, config.store.region) == (
        "s3",
        "offload-bucket",
        "eu-west-1",
    )
    policy = config.policy_for("persistent://acme/orders/t-partition-0")
    assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs, policy.block_size) == (True, 14400000, 33554432)
    assert policy.managedLedgerOffloadReadBufferSizeInBytes == 2097152


@pytest.mark.parametrize("path", [PULSAR_TOPIC, PULSAR_APPLIED])
def test_a_real_brokers_topic_policy_configures_a_filesystem_store(path: Path) -> None:
    """The topic's own policy, and the one applied (over the namespace's S3 bucket, which the filesystem driver
    does not use; the namespace's driver-neutral block sizes do apply)."""
    result = cli(str(path))
    assert result.returncode == 0, result.stderr
    sizes = path == PULSAR_APPLIED
    assert result.stdout == (
        '[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "/var/lib/pulsar/offload"\n\n[offload]\n'
        "managedLedgerOffloadDeletionLagMs = 600000\n"
        + (
            "managedLedgerOffloadMaxBlockSizeInBytes = 33554432\nmanagedLedgerOffloadReadBufferSizeInBytes = 2097152\n"
            if sizes
            else ""
        )
        + "enabled = false\n"
    )
    config = parse_config(tomllib.loads(result.stdout), "imported")
    assert (config.store.location.scheme, config.store.location.path) == ("file", "/var/lib/pulsar/offload")
    policy = config.policy_for("persistent://public/offload/big")
    assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs) == (False, 600000)
    assert policy.block_size == (33554432 if sizes else 64 << 20)


BROKER_CONF = """\
# Pulsar's docs, "Use AWS S3 offloader with Pulsar" (tiered-storage-aws): the offloader in broker.conf
managedLedgerOffloadDriver=aws-s3
offloadersDirectory=offloaders
s3ManagedLedgerOffloadBucket=pulsar-topic-offload
s3ManagedLedgerOffloadRegion=eu-west-3
s3ManagedLedgerOffloadServiceEndpoint=
s3ManagedLedgerOffloadMaxBlockSizeInBytes=67108864
s3ManagedLedgerOffloadReadBufferSizeInBytes=1048576
s3ManagedLedgerOffloadRole=
managedLedgerOffloadMaxThreads=2
managedLedgerOffloadDeletionLagMs=14400000
managedLedgerOffloadAutoTriggerSizeThresholdBytes=-1
"""


def test_a_broker_conf_offload_block_from_pulsars_docs_configures_the_job_unchanged(tmp_path: Path) -> None:
    """The block as an operator has it (Java properties, empty values unset, broker.conf's own names for the
    deletion lag and the threshold), through `policy import` as it is."""
    conf = tmp_path / "broker.conf"
    conf.write_text(BROKER_CONF)
    result = cli(str(conf))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[store]\n"
        'managedLedgerOffloadDriver = "aws-s3"\n'
        'bucket = "pulsar-topic-offload"\n'
        'region = "eu-west-3"\n'
        "\n"
        "[offload]\n"
        "managedLedgerOffloadDeletionLagMs = 14400000\n"
        "managedLedgerOffloadMaxBlockSizeInBytes = 67108864\n"
        "managedLedgerOffloadReadBufferSizeInBytes = 1048576\n"
        "enabled = false\n"
    )
    assert result.stderr.splitlines()[:2] == [
        "streamoffload policy import: not imported: managedLedgerOffloadMaxThreads: " + BROKER_SIDE,
        "streamoffload policy import: not imported: offloadersDirectory: " + BROKER_SIDE,
    ]
    config = parse_config(tomllib.loads(result.stdout), "imported")
    assert (config.store.location.scheme, config.store.bucket, config.store.region) == (
        "s3",
        "pulsar-topic-offload",
        "eu-west-3",
    )
    policy = config.policy_for("persistent://public/default/t")
    assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs, policy.block_size) == (False, 14400000, 64 << 20)
    assert policy.managedLedgerOffloadReadBufferSizeInBytes == 1048576


def test_a_broker_conf_line_that_is_not_a_property_is_named(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("managedLedgerOffloadDriver=aws-s3\n=oops\n")
    with pytest.raises(ConfigError, match=rf"^{conf}:2: not a broker.conf line \(key=value\): '=oops'$"):
        read_offload_policies(str(conf))
