"""``run --spark-conf KEY=VALUE``: over the file's ``[spark.conf]``, over the job's defaults; bad arguments refused in
one line naming the option; secret-named values never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.cli import build_parser, main
from streamoffload.cli_common import config_from_args
from streamoffload.commands.run import spark_conf
from streamoffload.streaming.job.session import session_plan, shown_settings

CONF = """\
[pulsar]
serviceUrl = "pulsar://127.0.0.1:6650"
topics = ["t"]

[store]
managedLedgerOffloadDriver = "filesystem"
root = "{root}"

[spark.conf]
"spark.sql.shuffle.partitions" = 4
"spark.ui.enabled" = true
"spark.executor.memory" = "3g"
"""


def _args(tmp_path: Path, *extra: str):
    path = tmp_path / "job.toml"
    path.write_text(CONF.format(root=tmp_path / "store"), encoding="utf-8")
    return build_parser().parse_args(["run", "--conf", str(path), *extra])


def test_command_line_over_file_over_defaults(tmp_path):
    args = _args(
        tmp_path,
        "--spark-conf",
        "spark.sql.shuffle.partitions=12",
        "--spark-conf",
        "spark.a.b= x=y ",
        "--spark-conf",
        "spark.sql.shuffle.partitions=16",
    )
    config, _path = config_from_args(args)
    user = spark_conf(config, args.spark_conf)
    assert user == {
        "spark.sql.shuffle.partitions": "16",  # the last --spark-conf of a key wins
        "spark.ui.enabled": "true",
        "spark.executor.memory": "3g",
        "spark.a.b": " x=y ",  # the value is everything after the first '=', as given
    }
    plan = session_plan("local[2]", user=user)
    assert plan.conf["spark.sql.shuffle.partitions"] == "16"  # not the job's 2 for local[2]
    assert plan.conf["spark.ui.enabled"] == "true"  # not the job's false on local masters
    assert plan.conf["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")


def test_without_the_option_the_file_stands(tmp_path):
    args = _args(tmp_path)
    config, _path = config_from_args(args)
    assert args.spark_conf == []
    assert spark_conf(config, args.spark_conf) == dict(config.spark.conf)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("spark.ui.enabled", "argument --spark-conf: expected KEY=VALUE, got 'spark.ui.enabled'"),
        ("=4", "argument --spark-conf: empty key in '=4'"),
        ("  =4", "argument --spark-conf: empty key in '  =4'"),
        (
            "spark.hadoop.fs.s3a.secret.key:hunter2hunter2",
            "argument --spark-conf: expected KEY=VALUE, got its text not shown: it names a secret",
        ),
    ],
)
def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys, argument, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--store", f"file://{tmp_path}", f"--spark-conf={argument}"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"streamoffload run: error: {message}"
    assert "hunter2" not in "\n".join(lines)


def test_secret_named_settings_are_masked_in_the_log_line():
    conf = {
        "spark.hadoop.fs.s3a.secret.key": "hunter2 with spaces",
        "spark.hadoop.fs.s3a.access.key": "AKIAABCDEFGHIJKLMNOP",
        "spark.ui.enabled": "true",
    }
    assert shown_settings(conf) == (
        "spark.hadoop.fs.s3a.access.key=***, spark.hadoop.fs.s3a.secret.key=***, spark.ui.enabled=true"
    )


def test_run_help_points_at_the_readmes_cluster_section(capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert 'README.md "Running on a cluster"' in help_text and "--spark-conf KEY=VALUE" in help_text
    assert "spark-submit --master yarn" not in help_text  # the recipes live in the README, tested there
    assert "\n## Running on a cluster\n" in readme
    section = readme.split("\n## Running on a cluster\n", 1)[1].split("\n## ", 1)[0]
    assert section.count("<!-- cluster:standalone -->") == section.count("<!-- /cluster:standalone -->") == 1
