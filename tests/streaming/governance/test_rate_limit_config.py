"""The rate limits as offload policy (issue 26): Pulsar-style keys at the policy levels, validated naming the key
and the file, published with the policy versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.config import load_config, parse_config
from streamoffload.errors import ConfigError
from streamoffload.streaming.governance.policy_versions import PolicyVersions, policy_document

MIB = 1 << 20


def test_defaults_are_unlimited() -> None:
    policy = parse_config({}).policy_for("persistent://public/default/t")
    assert policy.rate_limit("read") == (-1, -1)
    assert policy.rate_limit("upload") == (-1, -1)


def test_levels_and_size_strings() -> None:
    config = parse_config(
        {
            "offload": {
                "offloadUploadRateBytesPerSecond": "4MiB",
                "offloadTotalUploadRateBytesPerSecond": "10MiB",
                "offloadTotalReadRateBytesPerSecond": 50_000_000,
            },
            "namespaces": {"acme/orders": {"offloadUploadRateBytesPerSecond": "1MiB"}},
            "topics": {"persistent://acme/orders/big": {"offloadReadRateBytesPerSecond": "2m"}},
        }
    )
    assert config.policy_for("persistent://other/ns/t").rate_limit("upload") == (4 * MIB, 10 * MIB)
    big = config.policy_for("persistent://acme/orders/big-partition-3")
    assert big.rate_limit("upload") == (1 * MIB, 10 * MIB)
    assert big.rate_limit("read") == (2 * MIB, 50_000_000)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"offload": {"offloadUploadRateBytesPerSecond": 0}}, "offload.offloadUploadRateBytesPerSecond must be -1"),
        ({"offload": {"offloadReadRateBytesPerSecond": -5}}, "offload.offloadReadRateBytesPerSecond must be -1"),
        ({"offload": {"offloadReadRateBytesPerSecond": "fast"}}, "offload.offloadReadRateBytesPerSecond: expected"),
        ({"offload": {"offloadUploadRateBytesPerSecond": 2.5}}, "must be int"),
        ({"offload": {"offloadUploadRateBytesPerSecond": 2**41}}, "1 TiB/s"),
        ({"offload": {"offloadUploadRateBytesPerSec": 1}}, "did you mean 'offloadUploadRateBytesPerSecond'"),
        (
            {"namespaces": {"a/b": {"offloadTotalUploadRateBytesPerSecond": MIB}}},
            "is a limit of the whole job: set it in [offload]",
        ),
        (
            {"topics": {"persistent://a/b/c": {"offloadTotalReadRateBytesPerSecond": MIB}}},
            "(per topic-partition: offloadReadRateBytesPerSecond)",
        ),
    ],
)
def test_bad_values_name_the_key(doc: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "job.toml")
    assert "job.toml" in str(err.value)
    assert needle in str(err.value)


def test_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[topics."persistent://a/b/c"]\nofflodUploadRateBytesPerSecond = 5\n')
    with pytest.raises(ConfigError, match=rf"{path}: unknown offload policy key .*offloadUploadRateBytesPerSecond"):
        load_config(path)


def test_limits_are_versioned_like_every_policy_value() -> None:
    """A live edit is a new policy version: batches after its effective time see the new limit."""
    before = parse_config({"offload": {"offloadUploadRateBytesPerSecond": 10 * MIB}})
    after = parse_config({"offload": {"offloadUploadRateBytesPerSecond": 5 * MIB}})
    versions = PolicyVersions([(1_000, policy_document(before)), (20_000, policy_document(after))])
    assert versions.policy_at("persistent://a/b/c", 19_999).offloadUploadRateBytesPerSecond == 10 * MIB
    assert versions.policy_at("persistent://a/b/c", 20_000).offloadUploadRateBytesPerSecond == 5 * MIB
