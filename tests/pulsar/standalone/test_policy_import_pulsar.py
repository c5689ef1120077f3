"""``streamoffload policy import`` of what Apache Pulsar itself answers: offload policies set on a namespace and on
a topic through the admin REST API (what ``pulsar-admin namespaces|topics set-offload-policies`` call), read back
with ``GET`` (what ``get-offload-policies`` prints), imported, loaded, and the job configured with exactly the
values set. The answers are also the checked-in fixtures (``tests/commands/pulsar_json/pulsar-4.0.7-*.json``, captured
this way): a broker that answers otherwise fails here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from streamoffload.config import parse_config
from streamoffload.pulsar_standalone import PulsarStandalone
from tests.pulsar.standalone.broker_truth import new_namespace

pytestmark = pytest.mark.pulsar

FIXTURES = Path(__file__).resolve().parents[2] / "commands" / "pulsar_json"

NAMESPACE_POLICY = {
    "managedLedgerOffloadDriver": "aws-s3",
    "managedLedgerOffloadBucket": "offload-bucket",
    "managedLedgerOffloadRegion": "eu-west-1",
    "managedLedgerOffloadServiceEndpoint": "https://s3.eu-west-1.amazonaws.com",
    "managedLedgerOffloadMaxBlockSizeInBytes": 33554432,
    "managedLedgerOffloadReadBufferSizeInBytes": 2097152,
    "managedLedgerOffloadThresholdInBytes": 0,
    "managedLedgerOffloadDeletionLagInMillis": 14400000,
}
"""``set-offload-policies -d aws-s3 -b offload-bucket -r eu-west-1 -e https://s3.eu-west-1.amazonaws.com -mbs 32M
-rbs 2M -t 0 -dl 4h`` on the namespace."""
TOPIC_POLICY = {
    "managedLedgerOffloadDriver": "filesystem",
    "fileSystemURI": "file:///var/lib/pulsar/offload",
    "managedLedgerOffloadThresholdInBytes": -1,
    "managedLedgerOffloadDeletionLagInMillis": 600000,
}
"""The topic's own: the filesystem driver, no automatic offload, a 10-minute deletion lag."""


def get_text(broker: PulsarStandalone, path: str) -> str:
    """The GET answer's JSON text as ``pulsar-admin ... get-offload-policies`` prints it (indented)."""
    return json.dumps(broker.admin("GET", path), indent=2) + "\n"


def topic_policy(broker: PulsarStandalone, path: str) -> str:
    """A topic's offload policies once the broker serves them (topic policies travel through a system topic)."""
    deadline = time.monotonic() + 60
    while True:
        answer: Any = broker.admin("GET", path)
        if answer and answer.get("managedLedgerOffloadDriver") == "filesystem":
            return json.dumps(answer, indent=2) + "\n"
        assert time.monotonic() < deadline, f"{path}: the topic's policy never came back: {answer!r}"
        time.sleep(0.5)


def imported(text: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streamoffload", "policy", "import", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_get_offload_policies_of_a_live_broker_configure_the_job(apache_pulsar: PulsarStandalone) -> None:
    namespace = new_namespace(apache_pulsar, "offload-import")
    topic = f"{namespace}/big"
    apache_pulsar.admin("POST", f"/admin/v2/namespaces/{namespace}/offloadPolicies", NAMESPACE_POLICY)
    apache_pulsar.admin("PUT", f"/admin/v2/persistent/{topic}")
    apache_pulsar.admin("POST", f"/admin/v2/persistent/{topic}/offloadPolicies", TOPIC_POLICY)

    of_namespace = get_text(apache_pulsar, f"/admin/v2/namespaces/{namespace}/offloadPolicies")
    of_topic = topic_policy(apache_pulsar, f"/admin/v2/persistent/{topic}/offloadPolicies")
    applied = get_text(apache_pulsar, f"/admin/v2/persistent/{topic}/offloadPolicies?applied=true")
    assert json.loads(of_namespace) == json.loads((FIXTURES / "pulsar-4.0.7-namespace-aws-s3.json").read_text())
    assert json.loads(of_topic) == json.loads((FIXTURES / "pulsar-4.0.7-topic-filesystem.json").read_text())
    assert json.loads(applied) == json.loads((FIXTURES / "pulsar-4.0.7-topic-applied.json").read_text())

    config = parse_config(tomllib.loads(imported(of_namespace)), "namespace")
    store = config.store
    assert (store.managedLedgerOffloadDriver, store.bucket, store.region, store.serviceEndpoint) == (
        "aws-s3",
        "offload-bucket",
        "eu-west-1",
        "https://s3.eu-west-1.amazonaws.com",
    )
    assert store.location.scheme == "s3"
    policy = config.policy_for(f"persistent://{topic}")
    assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs) == (True, 14400000)
    assert (policy.block_size, policy.managedLedgerOffloadReadBufferSizeInBytes) == (33554432, 2097152)

    for text, sizes in ((of_topic, (64 << 20, 1 << 20)), (applied, (33554432, 2097152))):
        config = parse_config(tomllib.loads(imported(text)), "topic")
        assert (config.store.location.scheme, config.store.location.path) == ("file", "/var/lib/pulsar/offload")
        policy = config.policy_for(f"persistent://{topic}")
        assert (policy.enabled, policy.managedLedgerOffloadDeletionLagMs) == (False, 600000)
        assert (policy.block_size, policy.managedLedgerOffloadReadBufferSizeInBytes) == sizes
