from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.codecs.errors import ConfigError
from streamoffload.config import PolicySource, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "offload.toml"
    path.write_text(text)
    return path


def test_shipped_default_file_loads() -> None:
    config = load_config(REPO / "conf" / "streamoffload.toml")
    policy = config.policy_for("persistent://public/default/orders")
    assert policy.method == "streaming"
    assert policy.block_size == 64 * 1024 * 1024
    assert policy.max_segment_bytes == 1024 * 1024 * 1024
    # Relative paths are relative to the file, not to the working directory.
    assert config.store.root == str(REPO / "conf" / ".." / "var" / "store")


def test_most_specific_level_wins() -> None:
    config = parse_config(
        {
            "offload": {"maxSizePerOffloadSegmentMbytes": 100, "method": "streaming"},
            "namespaces": {"acme/orders": {"maxSizePerOffloadSegmentMbytes": 50}},
            "topics": {
                "persistent://acme/orders/big": {"maxSizePerOffloadSegmentMbytes": 500},
                "persistent://acme/orders/big-partition-2": {"method": "ledger"},
            },
        }
    )
    assert config.policy_for("persistent://other/ns/t").maxSizePerOffloadSegmentMbytes == 100
    assert config.policy_for("persistent://acme/orders/small").maxSizePerOffloadSegmentMbytes == 50
    # A partition inherits its partitioned topic's policy, and can override it.
    p1 = config.policy_for("persistent://acme/orders/big-partition-1")
    p2 = config.policy_for("persistent://acme/orders/big-partition-2")
    assert (p1.maxSizePerOffloadSegmentMbytes, p1.method) == (500, "streaming")
    assert (p2.maxSizePerOffloadSegmentMbytes, p2.method) == (500, "ledger")


def test_rollover_in_seconds_for_tests() -> None:
    config = parse_config({"offload": {"maxOffloadSegmentRolloverTimeSeconds": 3}})
    assert config.policy_for("t").rollover_ms == 3000


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"offload": {"maxSizePerOffloadSegmentMbyte": 1}}, "did you mean 'maxSizePerOffloadSegmentMbytes'"),
        ({"offload": {"method": "tiered"}}, "offload.method must be one of streaming, ledger"),
        ({"offload": {"enabled": "yes"}}, "offload.enabled must be bool"),
        ({"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": 100}}, "at least 141"),
        ({"offload": {"offloadBufferMaxBytes": 1 << 20}}, "offload.offloadBufferMaxBytes (1048576) must hold"),
        ({"topics": {"persistent://a/b/c": {"method": "nope"}}}, "topics.'persistent://a/b/c'.method"),
        ({"namespaces": {"justone": {}}}, "tenant/namespace"),
        ({"store": {"managedLedgerOffloadDriver": "gcs"}}, "store.managedLedgerOffloadDriver must be one of"),
        ({"store": {"managedLedgerOffloadDriver": "aws-s3"}}, "store.bucket is required"),
        ({"pulsar": {"topics": ["a/b"]}}, "pulsar.topics"),
        ({"sparkk": {}}, "unknown section [sparkk] (did you mean 'spark'?)"),
    ],
)
def test_errors_name_the_key_and_the_file(doc: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "conf/x.toml")
    assert needle in str(err.value)
    assert "conf/x.toml" in str(err.value)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[offload\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_policy_source_picks_up_changes_and_survives_a_bad_edit(tmp_path: Path) -> None:
    path = write(tmp_path, "[offload]\nmethod = 'streaming'\n")
    source = PolicySource(load_config(path), str(path), min_interval_s=0)
    assert source.policy_for("t").method == "streaming"
    path.write_text("[offload]\nmethod = 'ledger'\n# longer file so the size changes\n")
    assert source.policy_for("t").method == "ledger"
    path.write_text("[offload]\nmethod = 'garbage'\n")
    assert source.policy_for("t").method == "ledger"  # last good policy kept
    assert source.last_error is not None and "offload.method" in source.last_error
