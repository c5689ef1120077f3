"""What a configuration file says is checked when it is loaded, with one error naming the key, the value and the
file: two spellings of one topic's section, a table where a value belongs, the topics pattern, the trigger
interval and the metrics address (each was taken, or checked only when the job first used it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.cli import build_parser
from streamoffload.cli_common import config_from_args
from streamoffload.config import check_trigger_interval, load_config
from streamoffload.errors import ConfigError


def load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = tmp_path / "offload.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return path, str(err.value)


def test_two_spellings_of_one_topic_are_refused_naming_both(tmp_path: Path) -> None:
    text = """
[topics."orders"]
enabled = false

[topics."persistent://public/default/orders"]
maxSizePerOffloadSegmentMbytes = 8
"""
    path, message = load_error(tmp_path, text)
    assert message == (
        f"{path}: [topics.'orders'] and [topics.'persistent://public/default/orders'] are one topic, "
        "persistent://public/default/orders: merge them into one section"
    )
    # One spelling of each topic is fine, and a partition is a topic of its own.
    path.write_text('[topics."orders"]\nenabled = false\n[topics."orders-partition-0"]\nenabled = true\n')
    config = load_config(path)
    assert config.policy_for("orders").enabled is False
    assert config.policy_for("orders-partition-0").enabled is True


@pytest.mark.parametrize(
    ("text", "where", "kind"),
    [
        ('[pulsar.client]\nauth.token = "secret"\n', "pulsar.client.auth", "a table"),
        ('[pulsar.client]\ntlsCiphers = ["a", "b"]\n', "pulsar.client.tlsCiphers", "an array"),
        ("[spark.conf]\nspark.sql.shuffle.partitions = 4\n", "spark.conf.spark", "a table"),
    ],
)
def test_a_table_or_array_among_options_is_refused_naming_the_key(
    tmp_path: Path, text: str, where: str, kind: str
) -> None:
    path, message = load_error(tmp_path, text)
    assert message == (
        f"{path}: {where} is {kind}; its values are strings, numbers or booleans "
        '(a dotted name is written quoted: "a.b" = ...)'
    )


def test_option_values_are_passed_on_as_text(tmp_path: Path) -> None:
    path = tmp_path / "offload.toml"
    path.write_text(
        '[pulsar.client]\noperationTimeoutSeconds = 30\ntlsAllowInsecureConnection = true\nauthToken = "t"\n'
        '[spark.conf]\n"spark.sql.shuffle.partitions" = 4\n"spark.ui.enabled" = false\n'
    )
    config = load_config(path)
    assert dict(config.pulsar.client) == {
        "operationTimeoutSeconds": "30",
        "tlsAllowInsecureConnection": "true",
        "authToken": "t",
    }
    assert dict(config.spark.conf) == {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        (
            "public/default/orders-(",
            "bad regular expression 'orders-(': missing ), unterminated subpattern at position 7",
        ),
        ("non-persistent://public/default/orders-.*", "only persistent topics can be read, not non-persistent://"),
        ("public/orders-.*", "expected [persistent://]tenant/namespace/REGEX or REGEX, got 'public/orders-.*'"),
    ],
)
def test_a_bad_topics_pattern_is_refused_at_load(tmp_path: Path, pattern: str, problem: str) -> None:
    path, message = load_error(tmp_path, f'[pulsar]\ntopics_pattern = "{pattern}"\n')
    assert message == f"{path}: pulsar.topics_pattern {pattern!r}: {problem}"


TRIGGER_HELP = (
    "expected a Spark interval such as '5 seconds', '1 minute 30 seconds' or '500 milliseconds' (units: week, day, "
    "hour, minute, second, millisecond, microsecond; fractions of seconds only)"
)
# Spark 4's verdicts, read off Trigger.ProcessingTime(text) in the JVM (the spark-marked test below asks it again).
SPARK_ACCEPTS = [
    "5 seconds",
    "5 second",
    "1 minute",
    "1.5 seconds",
    "500 milliseconds",
    "interval 10 seconds",
    "10 SECONDS",
    "1 hour 30 minutes",
    "0 seconds",
    "1 week",
    " 5 seconds ",
    "+5 seconds",
    "5 microseconds",
]
SPARK_REFUSES = [
    "5s",
    "5seconds",
    "500 ms",
    "5 secs",
    "5 min",
    "1.5 minutes",
    "-5 seconds",
    "1 month",
    "1 year",
    "10",
    "",
    "1 minute, 2 seconds",
    "99999999999999999999 weeks",
]


@pytest.mark.parametrize("text", SPARK_REFUSES)
def test_a_trigger_interval_spark_would_refuse_is_refused_at_load(tmp_path: Path, text: str) -> None:
    path, message = load_error(tmp_path, f'[spark]\ntrigger_interval = "{text}"\n')
    assert message == f"{path}: spark.trigger_interval {text!r}: {TRIGGER_HELP}"


@pytest.mark.parametrize("text", SPARK_ACCEPTS)
def test_a_trigger_interval_spark_takes_is_taken(text: str) -> None:
    check_trigger_interval(text)


def test_the_trigger_interval_flag_is_checked_with_the_configuration(tmp_path: Path) -> None:
    # The configuration of `run`, built as the command builds it (not run: were the check missing, the job would).
    args = build_parser().parse_args(["run", "--store", str(tmp_path), "--topics", "t", "--trigger-interval", "5s"])
    with pytest.raises(ConfigError) as err:
        config_from_args(args)
    assert str(err.value) == f"--trigger-interval '5s': {TRIGGER_HELP}"


@pytest.mark.spark
def test_the_trigger_interval_check_agrees_with_spark(spark: object) -> None:
    trigger = spark._jvm.org.apache.spark.sql.streaming.Trigger  # type: ignore[attr-defined]
    for text in SPARK_ACCEPTS:
        trigger.ProcessingTime(text)
    for text in SPARK_REFUSES:
        with pytest.raises(Exception) as err:  # whatever the JVM raises, as pyspark hands it over
            trigger.ProcessingTime(text)
        assert type(err.value).__module__.startswith(("pyspark", "py4j")), (text, err.value)


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:", "127.0.0.1:99999", "host:port"])
def test_a_bad_metrics_address_is_refused_at_load(tmp_path: Path, address: str) -> None:
    path, message = load_error(tmp_path, f'[metrics]\naddress = "{address}"\n')
    assert message == f"{path}: metrics.address {address!r}: expected host:port, e.g. 127.0.0.1:9464"


def test_an_empty_metrics_address_disables_the_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "offload.toml"
    path.write_text('[metrics]\naddress = ""\n')
    assert load_config(path).metrics.address == ""
