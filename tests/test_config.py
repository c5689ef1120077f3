from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.config import PolicySource, load_config, parse_config
from streamoffload.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


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


# --- strict values: no inf or nan, bounded, durations and sizes as strings ---------------------------------

POLICY_NUMBER_KEYS = [
    "maxSizePerOffloadSegmentMbytes",
    "maxOffloadSegmentRolloverTimeMinutes",
    "maxOffloadSegmentRolloverTimeSeconds",
    "managedLedgerOffloadMaxBlockSizeInBytes",
    "managedLedgerOffloadReadBufferSizeInBytes",
    "offloadBufferMaxBytes",
    "managedLedgerOffloadDriverBufferBytes",
    "retentionTimeInMinutes",
    "retentionSizeInMB",
    "managedLedgerOffloadDeletionLagMs",
]


@pytest.mark.parametrize("key", POLICY_NUMBER_KEYS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_inf_and_nan_are_refused_at_every_level(tmp_path: Path, key: str, value: str) -> None:
    for section in ("[offload]", '[namespaces."a/b"]', '[topics."persistent://a/b/c"]'):
        path = write(tmp_path, f"{section}\n{key} = {value}\n")
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert key in str(err.value) and str(path) in str(err.value)
        assert "finite" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("managedLedgerOffloadMaxBlockSizeInBytes", 2**31, "at most 2147483647"),
        ("managedLedgerOffloadReadBufferSizeInBytes", 2**31, "at most 2147483647"),
        ("managedLedgerOffloadReadBufferSizeInBytes", 0, "must be positive"),
        ("maxSizePerOffloadSegmentMbytes", 1024 * 1024 + 1, "at most 1048576 (1 TiB)"),
        ("maxSizePerOffloadSegmentMbytes", 1e-9, "at least 1 byte"),
        ("maxSizePerOffloadSegmentMbytes", 1e300, "at most 1048576"),
        ("maxOffloadSegmentRolloverTimeMinutes", 30 * 24 * 60 + 1, "at most 43200 (30 days)"),
        ("maxOffloadSegmentRolloverTimeMinutes", 1e-6, "at least 1 ms"),
        ("maxOffloadSegmentRolloverTimeMinutes", 0, "must be positive"),
        ("maxOffloadSegmentRolloverTimeSeconds", 1e300, "at most 43200"),
        ("offloadBufferMaxBytes", 2**40 + 1, "at most 1099511627776 (1 TiB)"),
        ("retentionTimeInMinutes", -5, "must be -1 (keep forever) or between 0 and"),
        ("retentionTimeInMinutes", 1e15, "(100 years)"),
        ("retentionSizeInMB", -2, "must be -1 (no limit)"),
        ("retentionSizeInMB", 2.0**41, "(1 EiB)"),
        ("managedLedgerOffloadDeletionLagMs", -1, "between 0 and"),
        ("managedLedgerOffloadDeletionLagMs", 2**63, "(100 years)"),
    ],
)
def test_values_out_of_bounds_are_refused(key: str, value: float, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"offload": {key: value}}, "conf/x.toml")
    text = str(err.value)
    assert needle in text and "conf/x.toml" in text
    assert ("offload." + key in text) or key.endswith("Seconds")


def test_bounds_are_inclusive() -> None:
    policy = parse_config(
        {
            "offload": {
                "managedLedgerOffloadMaxBlockSizeInBytes": 2**31 - 1,
                "managedLedgerOffloadReadBufferSizeInBytes": 2**31 - 1,
                "maxSizePerOffloadSegmentMbytes": 1024 * 1024,
                "maxOffloadSegmentRolloverTimeMinutes": 30 * 24 * 60,
                "offloadBufferMaxBytes": 2**40,
                "retentionTimeInMinutes": 0,
                "retentionSizeInMB": 0,
                "managedLedgerOffloadDeletionLagMs": 0,
            }
        }
    ).policy_for("t")
    assert policy.max_segment_bytes == 2**40
    assert policy.rollover_ms == 30 * 24 * 60 * 60_000


@pytest.mark.parametrize(
    ("key", "text", "attribute", "expected"),
    [
        ("managedLedgerOffloadDeletionLagMs", "4h", "managedLedgerOffloadDeletionLagMs", 4 * 3600 * 1000),
        ("managedLedgerOffloadDeletionLagMs", "500ms", "managedLedgerOffloadDeletionLagMs", 500),
        ("managedLedgerOffloadDeletionLagMs", "1h30m", "managedLedgerOffloadDeletionLagMs", 90 * 60_000),
        ("managedLedgerOffloadDeletionLagMs", "1.5s", "managedLedgerOffloadDeletionLagMs", 1500),
        ("maxOffloadSegmentRolloverTimeMinutes", "90s", "rollover_ms", 90_000),
        ("maxOffloadSegmentRolloverTimeMinutes", "65s", "rollover_ms", 65_000),
        ("maxOffloadSegmentRolloverTimeMinutes", "10min", "rollover_ms", 600_000),
        ("maxOffloadSegmentRolloverTimeMinutes", "2d", "rollover_ms", 2 * 86_400_000),
        ("maxOffloadSegmentRolloverTimeSeconds", "250ms", "rollover_ms", 250),
        ("retentionTimeInMinutes", "7d", "retentionTimeInMinutes", 7 * 24 * 60.0),
        ("managedLedgerOffloadMaxBlockSizeInBytes", "64MiB", "block_size", 64 << 20),
        ("managedLedgerOffloadMaxBlockSizeInBytes", "1.5k", "block_size", 1536),
        ("managedLedgerOffloadReadBufferSizeInBytes", "512 KiB", "managedLedgerOffloadReadBufferSizeInBytes", 1 << 19),
        ("maxSizePerOffloadSegmentMbytes", "2GiB", "max_segment_bytes", 2 << 30),
        ("maxSizePerOffloadSegmentMbytes", "24000b", "max_segment_bytes", 24_000),
        ("retentionSizeInMB", "1TB", "retentionSizeInMB", 1024 * 1024.0),
        ("offloadBufferMaxBytes", "1g", "offloadBufferMaxBytes", 1 << 30),
    ],
)
def test_durations_and_sizes_as_strings(key: str, text: str, attribute: str, expected: float) -> None:
    # A broker taking only small messages lets the small blocks below through (checkpoints.policy).
    policy = parse_config({"pulsar": {"max_message_size": 256}, "offload": {key: text}}).policy_for("t")
    value = getattr(policy, attribute)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("key", "text", "needle"),
    [
        ("managedLedgerOffloadDeletionLagMs", "4 hours", "expected a duration like 90s"),
        ("managedLedgerOffloadDeletionLagMs", "-1h", "expected a duration"),
        ("managedLedgerOffloadDeletionLagMs", "0.5ms", "whole number of ms"),
        ("managedLedgerOffloadDeletionLagMs", "inf", "expected a duration"),
        ("maxOffloadSegmentRolloverTimeMinutes", "90", "expected a duration"),
        ("retentionTimeInMinutes", "forever", "expected a duration"),
        ("managedLedgerOffloadMaxBlockSizeInBytes", "64 megs", "expected a size like"),
        ("managedLedgerOffloadMaxBlockSizeInBytes", "1.5", "whole number of bytes"),
        ("managedLedgerOffloadMaxBlockSizeInBytes", "nan", "expected a size like"),
        ("maxSizePerOffloadSegmentMbytes", "2PiB", "expected a size like"),
        ("method", 5, "offload.method must be str"),
    ],
)
def test_bad_duration_and_size_strings(key: str, text: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"offload": {key: text}}, "conf/x.toml")
    assert needle in str(err.value) and f"offload.{key}" in str(err.value) and "conf/x.toml" in str(err.value)


def test_durations_and_sizes_are_still_bounded() -> None:
    with pytest.raises(ConfigError, match="at most 43200"):
        parse_config({"offload": {"maxOffloadSegmentRolloverTimeMinutes": "31d"}})
    with pytest.raises(ConfigError, match="at most 2147483647"):
        parse_config({"offload": {"managedLedgerOffloadMaxBlockSizeInBytes": "2GiB"}})


def test_the_effective_policy_of_a_configured_topic_is_checked_at_load() -> None:
    """Namespace and topic sections each valid against [offload], but not merged together."""
    doc = {
        "namespaces": {"a/b": {"managedLedgerOffloadMaxBlockSizeInBytes": 100_000_000}},
        "topics": {"persistent://a/b/c": {"offloadBufferMaxBytes": 70_000_000}},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "conf/x.toml")
    assert "topics.'persistent://a/b/c'.offloadBufferMaxBytes" in str(err.value)
    assert "effective policy of persistent://a/b/c" in str(err.value)


@pytest.mark.parametrize(
    ("pulsar", "needle"),
    [
        ({"max_entries_per_trigger": 0}, "pulsar.max_entries_per_trigger must be between 1 and"),
        ({"max_entries_per_trigger": float("inf")}, "pulsar.max_entries_per_trigger must be a finite number"),
        ({"max_entries_per_trigger": "lots"}, "must be a whole number"),
        ({"max_bytes_per_trigger": -1}, "pulsar.max_bytes_per_trigger must be between 1 and"),
        ({"max_bytes_per_trigger": float("nan")}, "must be a finite number"),
        ({"max_bytes_per_trigger": "1.5b"}, "must be int"),
        ({"topics_pattern": 5}, "pulsar.topics_pattern must be a string"),
    ],
)
def test_settings_are_strict_too(pulsar: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"pulsar": pulsar}, "conf/x.toml")
    assert needle in str(err.value) and "conf/x.toml" in str(err.value)


def test_trigger_limits_take_counts_and_sizes() -> None:
    pulsar = parse_config({"pulsar": {"max_bytes_per_trigger": "256MiB", "max_entries_per_trigger": "1000"}}).pulsar
    assert (pulsar.max_bytes_per_trigger, pulsar.max_entries_per_trigger) == (256 << 20, 1000)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(b"[offload]\nmethod = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


# --- topic names the store cannot hold ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["pulsar", "topics"])
def test_a_topic_whose_directory_name_is_too_long_is_refused_at_load(where: str) -> None:
    long_name = "é" * 43  # 43 x 6 = 258 bytes once percent-encoded
    doc = {"pulsar": {"topics": [long_name]}} if where == "pulsar" else {"topics": {long_name: {"method": "ledger"}}}
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "conf/x.toml")
    text = str(err.value)
    assert "conf/x.toml" in text and long_name in text and "258 bytes" in text and "255" in text
    fits = "é" * 42
    doc = {"pulsar": {"topics": [fits]}} if where == "pulsar" else {"topics": {fits: {"method": "ledger"}}}
    parse_config(doc)


def test_a_topic_whose_keys_exceed_1024_bytes_with_the_prefix_is_refused_at_load() -> None:
    store = {"managedLedgerOffloadDriver": "s3", "bucket": "b", "prefix": "p" * 900}
    with pytest.raises(ConfigError) as err:
        parse_config({"store": store, "pulsar": {"topics": ["persistent://tenant/ns/" + "t" * 30]}}, "conf/x.toml")
    assert "more than the 1024 S3 allows" in str(err.value) and "t" * 30 in str(err.value)
    parse_config({"store": store, "pulsar": {"topics": ["persistent://tenant/ns/t"]}})
    # The filesystem driver has no key prefix: the same topic fits there.
    parse_config({"pulsar": {"topics": ["persistent://tenant/ns/" + "t" * 30]}})


def test_non_persistent_topics_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="only persistent topics are offloaded"):
        parse_config({"pulsar": {"topics": ["non-persistent://public/default/t"]}})


def test_check_topic_fits_for_the_job() -> None:
    from streamoffload.codecs.topics import TopicNameError
    from streamoffload.storage import keys

    assert str(keys.check_topic_fits("", "t-partition-3")) == "persistent://public/default/t-partition-3"
    with pytest.raises(keys.TopicTooLongError, match="tenant is 256 bytes") as err:
        keys.check_topic_fits("", f"persistent://{'x' * 256}/ns/t")
    assert isinstance(err.value, TopicNameError)
    # The longest key is exactly at the limit: fits; one byte more does not.
    topic = "persistent://a/b/c"
    longest = max(len(k.encode()) for k in keys.longest_keys("", topic))
    keys.check_topic_fits("p" * (1024 - longest - 1), topic)
    with pytest.raises(keys.TopicTooLongError, match="1025 bytes"):
        keys.check_topic_fits("p" * (1024 - longest), topic)


# --- hot reload keeps the last good policy when an edit breaks the new rules ----------------------------------


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ("[offload]\nmaxOffloadSegmentRolloverTimeMinutes = inf\n", "maxOffloadSegmentRolloverTimeMinutes"),
        ("[offload]\nmaxSizePerOffloadSegmentMbytes = inf\n", "maxSizePerOffloadSegmentMbytes"),
        ("[offload]\nretentionSizeInMB = nan\n", "retentionSizeInMB"),
        ("[offload]\nmanagedLedgerOffloadDeletionLagMs = '4 hours'\n", "managedLedgerOffloadDeletionLagMs"),
        ("[offload]\nmanagedLedgerOffloadMaxBlockSizeInBytes = 3000000000\n", "at most 2147483647"),
        (f"[topics.'{'é' * 43}']\nmethod = 'ledger'\n", "255 a directory name can hold"),
        ("[offload]\nmethod = '\udcff'\n", "not UTF-8"),
    ],
)
def test_policy_source_keeps_the_last_good_policy_on_an_invalid_edit(tmp_path: Path, edit: str, needle: str) -> None:
    path = write(tmp_path, "[offload]\nmaxOffloadSegmentRolloverTimeMinutes = '90s'\n")
    source = PolicySource(load_config(path), str(path), min_interval_s=0)
    assert source.policy_for("t").rollover_ms == 90_000
    path.write_bytes(edit.encode("utf-8", "surrogateescape") + b"# a longer file, so that the size changes\n")
    policy = source.policy_for("t")  # no exception: a running job keeps offloading
    assert policy.rollover_ms == 90_000 and policy.max_segment_bytes == 1024 * 1024 * 1024
    assert source.last_error is not None and needle in source.last_error and str(path) in source.last_error
    path.write_text("[offload]\nmaxOffloadSegmentRolloverTimeMinutes = '2m'\n")
    assert source.policy_for("t").rollover_ms == 120_000 and source.last_error is None


def test_metrics_topic_series_defaults_to_100_and_takes_0_to_a_million(tmp_path: Path) -> None:
    assert parse_config({}).metrics.topic_series == 100
    assert load_config(REPO / "conf" / "streamoffload.toml").metrics.topic_series == 100
    path = write(tmp_path, '[metrics]\naddress = ""\ntopic_series = 0\n')
    assert load_config(path).metrics.topic_series == 0  # no per-topic series, namespace totals only
    assert parse_config({"metrics": {"topic_series": 1_000_000}}).metrics.topic_series == 1_000_000
    assert parse_config({"metrics": {"topic_series": 250.0}}).metrics.topic_series == 250


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (-1, "metrics.topic_series must be between 0 (no per-topic series) and 1000000, got -1"),
        (1_000_001, "metrics.topic_series must be between 0 (no per-topic series) and 1000000"),
        (2.5, "metrics.topic_series must be int, got float 2.5"),
        ("100", "metrics.topic_series must be int, got str '100'"),
        (True, "metrics.topic_series must be int, got bool True"),
        (float("inf"), "metrics.topic_series must be a finite number"),
    ],
)
def test_metrics_topic_series_errors_name_the_key_and_the_file(tmp_path: Path, value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"metrics": {"topic_series": value}}, "conf/x.toml")
    assert needle in str(err.value) and "conf/x.toml" in str(err.value)
    path = write(tmp_path, "[metrics]\ntopic_series = -5\n")
    with pytest.raises(ConfigError, match=rf"^{path}: metrics.topic_series must be between 0"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"unknown key metrics.topic_serie \(did you mean 'topic_series'\?\)"):
        parse_config({"metrics": {"topic_serie": 5}}, "conf/x.toml")
