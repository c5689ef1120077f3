"""Other names the configuration file accepts for its keys, in one table: Apache Pulsar's own (``broker.conf``'s
store keys and the namespace offload-policy fields of ``OffloadPoliciesImpl``, what ``pulsar-admin namespaces
get-offload-policies`` prints) and the file's older spellings. A leaf: plain data that ``streamoffload.config``
reads (and ``streamoffload policy import`` translates with), importing nothing of the project.

The file's own style is camelCase, as Pulsar's keys and the Spark sources' options are (``serviceUrl``,
``topicsPattern``, ``triggerInterval``, ``keysFile``); a settings key whose field is ``snake_case`` in the code
is also accepted as written before (``service_url``). Each other name stands for exactly one key of ours; a key
given under two of its names in one table is refused, naming both."""

from __future__ import annotations

import re
from dataclasses import dataclass

POLICY = "policy"
"""The section kind of the policy tables: ``[offload]``, ``[namespaces."t/ns"]``, ``[topics."..."]``."""


@dataclass(frozen=True)
class Alias:
    """``name`` is accepted in ``section`` for our key ``target``; ``origin`` says whose name it is, ``note``
    what a reader of Pulsar's documentation should know (shown in README's table)."""

    name: str
    target: str
    section: str
    origin: str
    note: str = ""
    factor: float = 1.0
    """A number given under ``name`` is multiplied by this for ``target`` (seconds for minutes: 1/60)."""


BROKER_CONF = "broker.conf"
OFFLOAD_POLICIES = "OffloadPolicies"
STREAMOFFLOAD = "streamoffload"

ALIASES: tuple[Alias, ...] = (
    # [store]: broker.conf's offloader keys (and OffloadPolicies' fields of the same names).
    Alias("s3ManagedLedgerOffloadBucket", "bucket", "store", BROKER_CONF),
    Alias("managedLedgerOffloadBucket", "bucket", "store", BROKER_CONF, "the driver-neutral name (Pulsar 2.10+)"),
    Alias("s3ManagedLedgerOffloadRegion", "region", "store", BROKER_CONF),
    Alias("managedLedgerOffloadRegion", "region", "store", BROKER_CONF),
    Alias("s3ManagedLedgerOffloadServiceEndpoint", "serviceEndpoint", "store", BROKER_CONF),
    Alias("managedLedgerOffloadServiceEndpoint", "serviceEndpoint", "store", BROKER_CONF),
    Alias(
        "fileSystemURI",
        "root",
        "store",
        BROKER_CONF,
        "filesystem driver: a local directory, file:///dir or a path (Pulsar's HDFS URIs are refused)",
    ),
    # Policy: OffloadPolicies' field names where ours are broker.conf's or differ.
    Alias(
        "managedLedgerOffloadDeletionLagInMillis",
        "managedLedgerOffloadDeletionLagMs",
        POLICY,
        OFFLOAD_POLICIES,
        "how long a segment whose ledgers are all deleted stays readable before its objects go",
    ),
    Alias("s3ManagedLedgerOffloadMaxBlockSizeInBytes", "managedLedgerOffloadMaxBlockSizeInBytes", POLICY, BROKER_CONF),
    Alias(
        "s3ManagedLedgerOffloadReadBufferSizeInBytes", "managedLedgerOffloadReadBufferSizeInBytes", POLICY, BROKER_CONF
    ),
    Alias(
        "managedLedgerOffloadThresholdInBytes",
        "enabled",
        POLICY,
        OFFLOAD_POLICIES,
        "-1 (Pulsar: no automatic offload) is enabled = false, 0 (as soon as possible) enabled = true; "
        "a positive threshold is refused: this job offloads every entry continuously",
    ),
    Alias(
        "managedLedgerOffloadAutoTriggerSizeThresholdBytes",
        "enabled",
        POLICY,
        BROKER_CONF,
        "as managedLedgerOffloadThresholdInBytes",
    ),
    Alias(
        "managedLedgerOffloadDriverBufferBytes",
        "offloadBufferMaxBytes",
        POLICY,
        STREAMOFFLOAD,
        "PIP-76's name of the offload buffer bound",
    ),
    Alias(
        "maxOffloadSegmentRolloverTimeSeconds",
        "maxOffloadSegmentRolloverTimeMinutes",
        POLICY,
        STREAMOFFLOAD,
        "seconds, where Pulsar has minutes only (short rollovers for tests and demos)",
        factor=1 / 60,
    ),
)
"""Every other name a key has: one row per name."""

THRESHOLD_KEYS = frozenset(
    {"managedLedgerOffloadThresholdInBytes", "managedLedgerOffloadAutoTriggerSizeThresholdBytes"}
)
THRESHOLD_PROBLEM = (
    "is Pulsar's size of a topic's data kept on BookKeeper before automatic offload; this job offloads every "
    "entry continuously (segments seal by maxSizePerOffloadSegmentMbytes and maxOffloadSegmentRolloverTimeMinutes), "
    "so only -1 (no offload: enabled = false) and 0 (as soon as possible: enabled = true) mean something here"
)

REFUSED: dict[tuple[str, str], str] = {
    ("store", "fileSystemProfilePath"): (
        "is the Hadoop configuration of Pulsar's HDFS offloader; this store writes a local directory "
        "(root, or fileSystemURI = file:///dir) and reads no Hadoop profile"
    ),
    ("store", "s3ManagedLedgerOffloadCredentialId"): "credentials come from the AWS chain (environment, profile, role)",
    ("store", "s3ManagedLedgerOffloadCredentialSecret"): (
        "credentials come from the AWS chain (environment, profile, role)"
    ),
    ("store", "s3ManagedLedgerOffloadRole"): "credentials come from the AWS chain (AWS_ROLE_ARN, a profile's role_arn)",
}
"""Pulsar's names that have no meaning here: refused with the reason (never with the value: a secret)."""

STORE_NAMES = frozenset(
    {a.name for a in ALIASES if a.section == "store"} | {name for section, name in REFUSED if section == "store"}
)
"""Pulsar's store names: in a policy table they are said to belong in ``[store]``."""

_SNAKE = re.compile(r"_([a-z0-9])")


def house_name(field: str) -> str:
    """The file's spelling of a settings field: camelCase (``service_url`` -> ``serviceUrl``)."""
    return _SNAKE.sub(lambda m: m.group(1).upper(), field)


def aliases_in(section: str) -> dict[str, Alias]:
    """Pulsar's (and our other) names of ``section``'s keys (``POLICY`` for the policy tables)."""
    return {a.name: a for a in ALIASES if a.section == section}


__all__ = [
    "ALIASES",
    "POLICY",
    "REFUSED",
    "STORE_NAMES",
    "THRESHOLD_KEYS",
    "THRESHOLD_PROBLEM",
    "Alias",
    "aliases_in",
    "house_name",
]
