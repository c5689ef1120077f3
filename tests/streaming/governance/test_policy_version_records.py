"""A published policy version (``_meta/policies/<effectiveMs>``) is read from the store and trusted no more than a
configuration file: one that is not JSON, not an object of the three policy sections, names an unknown key, or
holds a value of the wrong type or out of range is one ``ConfigError`` naming the object and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamoffload.errors import ConfigError
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import StoreLocation
from streamoffload.streaming.governance.policy_versions import PolicyLog, decode_version

KEY = "fuzz/_meta/policies/00000001700000000000"
GOOD = {"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 8 * 1024 * 1024}, "namespaces": {}, "topics": {}}
TOPIC = "persistent://public/default/orders-partition-0"


def record(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xd5\x00{", r"not a policy version \(not JSON: 'utf-8' codec can't decode byte 0xd5"),
        (b'{"offload": ', r"not a policy version \(not JSON: Expecting value: line 1 column 13"),
        (b"[1]", "not a policy version: a JSON object, not list"),
        (record(topics=None), r"\[topics\] must be a table, got NoneType"),
        (record(offload=2**70), r"\[offload\] must be a table, got int"),
        (record(offload="x"), r"\[offload\] must be a table, got str"),
        (record(extra={}), "not a policy version: unknown section 'extra'"),
        (
            record(offload={"managedLedgerOffloadMaxBlockSizeInBytez": 4096}),
            "unknown offload policy key offload.managedLedgerOffloadMaxBlockSizeInBytez "
            r"\(did you mean 'managedLedgerOffloadMaxBlockSizeInBytes'\?\)",
        ),
        (
            record(offload={"managedLedgerOffloadMaxBlockSizeInBytes": 2**70}),
            rf"offload.managedLedgerOffloadMaxBlockSizeInBytes must be at least \d+ .* got {2**70}",
        ),
        (
            record(offload={"maxSizePerOffloadSegmentMbytes": 10**400}),
            "offload.maxSizePerOffloadSegmentMbytes must be a finite number, got an integer of "
            f"{(10**400).bit_length()} bits",
        ),
        (record(offload={"enabled": 2}), "offload.enabled must be bool, got int 2"),
        (
            record(topics={TOPIC: {"offloadBufferMaxBytes": 1024}}),
            rf"topics.'{TOPIC}'.offloadBufferMaxBytes \(1024\) must hold at least one block",
        ),
    ],
)
def test_a_malformed_policy_version_is_one_error_naming_it(data: bytes, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^{KEY}: {why}") as err:
        decode_version(data, KEY)
    assert "\n" not in str(err.value)


def test_the_job_reads_versions_through_the_check(tmp_path: Path) -> None:
    """The driver (``versions``) and the executors (``policy_at``) read the store's versions checked: a damaged
    one stops them with that error, not a JSONDecodeError or a TypeError from deep in the policy."""
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    key = keys.prefix_meta_prefix("fuzz", keys.POLICIES) + f"{1_700_000_000_000:020d}"
    assert key == KEY
    store.put(key, record())
    log = PolicyLog(StoreLocation("file", path=str(root), prefix="fuzz"))
    assert log.versions() == [(1_700_000_000_000, GOOD)]
    assert log.policy_at(TOPIC, 1_700_000_000_001).block_size == 8 * 1024 * 1024
    store.put(key, record(topics=None))
    for read in (log.versions, lambda: PolicyLog(log.location).policy_at(TOPIC, 1_700_000_000_001)):
        with pytest.raises(ConfigError, match=rf"^{KEY}: \[topics\] must be a table, got NoneType$"):
            read()
