"""Apache Pulsar standalone with its own tiered storage: the jcloud offloader (driver ``aws-s3``) writing to a moto
bucket, and ``pulsar-admin topics offload`` through the admin REST API. For bench/pulsar_offloader.py
and tests/interop/test_pulsar_offloaded.py (through tests/fixtures/pulsar_offloader.py, which skips when the NAR is
missing). Plain helpers, not a pytest plugin.

The offloader NAR: Maven Central has no ``tiered-storage-jcloud`` ``.nar`` artifact for 4.0.x, but its ``.jar`` *is*
the NAR (NiFi's plugin packs ``META-INF/bundled-dependencies`` and ``META-INF/services/pulsar-offloader.yaml`` into
it). Central has it at 4.0.6 and 4.0.8, not 4.0.7 (the broker, ``pulsar_standalone.PULSAR_VERSION``); 4.0.8's
(:data:`OFFLOADER_VERSION`) is the one the reader harness (tests/pulsar_reader) resolves, and a 4.0.7 broker loads
it (the patch releases share the offloader SPI).
It is copied from the harness's build (``scripts/test.sh`` builds it) into a directory of its own as
``tiered-storage-jcloud-4.0.8.nar``: the broker loads every ``*.nar`` of ``offloadersDirectory``.

The broker's jclouds aws-s3 provider asks the default region's endpoint (``https://s3.amazonaws.com``) for a
bucket's location whatever the service endpoint: ``-Djclouds.region.us-standard.endpoint`` points that at moto too
(Pulsar hands every ``jclouds*`` system property to jclouds), so nothing leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.s3_endpoint import S3_CREDENTIALS, S3_REGION
from streamoffload.embedded_broker import BrokerError
from streamoffload.pulsar_standalone import PulsarStandalone

OFFLOADER_VERSION = "4.0.8"
"""The Pulsar release whose offloader the reader harness runs (``pulsar.version`` in tests/pulsar_reader/pom.xml)."""
ROOT = Path(__file__).resolve().parents[1]
HARNESS_SOURCE = ROOT / "tests" / "pulsar_reader"
NAR_NAME = f"tiered-storage-jcloud-{OFFLOADER_VERSION}.nar"


def harness_dir() -> Path:
    """Where ``scripts/test.sh`` builds the reader harness (``STREAMOFFLOAD_PULSAR_READER_DIR`` points elsewhere)."""
    return Path(os.environ.get("STREAMOFFLOAD_PULSAR_READER_DIR") or ROOT / ".cache" / "pulsar_reader")


def build_command() -> str:
    return f"mvn -q -B -s {HARNESS_SOURCE / 'settings.xml'} -f {HARNESS_SOURCE / 'pom.xml'} package"


def offloader_jar() -> Path:
    """The jcloud offloader's jar in the harness's build (it may not exist yet)."""
    return harness_dir() / "lib" / f"tiered-storage-jcloud-{OFFLOADER_VERSION}.jar"


def offloaders_dir(parent: Path) -> Path:
    """``parent/offloaders`` holding the jcloud offloader NAR (module docstring); FileNotFoundError naming the jar
    and how to build it when it is not resolved."""
    jar = offloader_jar()
    if not jar.is_file():
        raise FileNotFoundError(
            f"Pulsar's jcloud offloader {jar} is not resolved ({build_command()}; scripts/test.sh does it)"
        )
    target = parent / "offloaders"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(jar, target / NAR_NAME)
    return target


def offloading_broker(data_dir: Path, endpoint: str, bucket: str, offloaders: Path, **options: Any) -> PulsarStandalone:
    """A (not yet started) broker whose tiered storage is ``bucket`` on ``endpoint``: broker.conf's names, as an
    operator configures it; credentials in the JVM's environment. ``options`` go to :class:`PulsarStandalone`
    (``config`` entries are added to these)."""
    config = {
        "managedLedgerOffloadDriver": "aws-s3",
        "s3ManagedLedgerOffloadBucket": bucket,
        "s3ManagedLedgerOffloadServiceEndpoint": endpoint,
        "s3ManagedLedgerOffloadRegion": S3_REGION,
        "offloadersDirectory": str(offloaders),
        "narExtractionDirectory": str(data_dir / "nar"),
        # No automatic offload: a test or bench says when (pulsar-admin topics offload).
        "managedLedgerOffloadAutoTriggerSizeThresholdBytes": -1,
        **options.pop("config", {}),
    }
    jvm = [
        f"-Djclouds.region.us-standard.endpoint={endpoint}",
        "-Djclouds.max-retries=3",  # Pulsar sets 100: a wrong endpoint would be minutes of retries
        *options.pop("jvm_options", ()),
    ]
    env = {"AWS_ACCESS_KEY_ID": S3_CREDENTIALS["access_key"], "AWS_SECRET_ACCESS_KEY": S3_CREDENTIALS["secret_key"]}
    return PulsarStandalone(data_dir, config=config, jvm_options=jvm, env=env, **options)


def rest_topic(topic: str) -> str:
    """``persistent/tenant/ns/local`` of a ``persistent://`` name, as the admin API's paths take it."""
    return topic.replace("://", "/", 1)


def offload_topic(broker: PulsarStandalone, topic: str, *, timeout: float = 300.0) -> dict[str, Any]:
    """``pulsar-admin topics offload`` of every closed ledger: ``PUT .../offload`` with the MessageId of the current
    ledger's first entry (Pulsar offloads the ledgers before the one holding it, and takes entry 0 of an empty
    current ledger too), then ``GET .../offload`` polled until it is no longer ``RUNNING``. Returns the topic's
    ``internal-info`` after it; ``BrokerError`` on ``ERROR``."""
    path = f"/admin/v2/{rest_topic(topic)}"
    current = broker.admin("GET", f"{path}/internalStats")["ledgers"][-1]["ledgerId"]
    broker.admin("PUT", f"{path}/offload", {"ledgerId": current, "entryId": 0, "partitionIndex": -1})
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        status = broker.admin("GET", f"{path}/offload")
        if status["status"] == "ERROR":
            raise BrokerError(f"offload of {topic} failed: {status.get('lastError')}")
        if status["status"] != "RUNNING":
            info: dict[str, Any] = broker.admin("GET", f"{path}/internal-info")
            return info
        if time.monotonic() > deadline:
            raise BrokerError(f"offload of {topic} still RUNNING after {timeout:g} s (log {broker.log_path})")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
