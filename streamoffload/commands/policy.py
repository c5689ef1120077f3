"""``streamoffload policy TOPIC``: the offload policy a topic-partition gets, and where each value came from
(like ``pulsar-admin topics get-offload-policies --applied``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.cli_common import config_from_args, topic_arg
from streamoffload.codecs.topics import TopicName
from streamoffload.config import Config
from streamoffload.errors import ConfigError

EPILOG = """\
examples:
  streamoffload policy --conf conf/streamoffload.toml persistent://public/default/orders
  streamoffload policy --conf prod.toml orders-partition-3 --json

Levels, most specific last: default (built in), broker ([offload]), namespace ([namespaces."t/ns"]),
topic ([topics."persistent://t/ns/topic"], which its partitions inherit), partition.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "policy",
        help="show the offload policy a topic gets, and which level each value comes from",
        description="Print the applied offload policy of TOPIC from the configuration file, with the level that "
        "set each value. The running job publishes the same policy to the store when the file changes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--conf", metavar="FILE", required=True, help="TOML configuration file")
    parser.add_argument("topic", metavar="TOPIC", help="topic or topic-partition")
    parser.add_argument("--json", action="store_true", help="one JSON object: key -> {value, level}")
    parser.set_defaults(func=run)


def applied_policy(config: Config, topic: TopicName | str) -> dict[str, tuple[Any, str]]:
    """``{key: (value, level)}`` of the policy ``config`` gives ``topic`` (the same merge as
    ``Config.policy_for``, which also validates it)."""
    name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    policy: OffloadPolicy = config.policy_for(name)
    levels: list[tuple[str, Any]] = [
        ("broker", config.broker_policy),
        (f"namespace {name.namespace_name}", config.namespace_policies.get(name.namespace_name, {})),
        (f"topic {name.base}", config.topic_policies.get(str(name.base), {})),
    ]
    if name.is_partition:
        levels.append((f"partition {name}", config.topic_policies.get(str(name), {})))
    out: dict[str, tuple[Any, str]] = {}
    for field in fields(OffloadPolicy):
        level = "default"
        for label, table in levels:
            if field.name in table:
                level = label
        out[field.name] = (getattr(policy, field.name), level)
    return out


def run(args: argparse.Namespace) -> int:
    config, path = config_from_args(args, need_file_or_store=False)
    if path is None:
        raise ConfigError("give --conf FILE")
    topic = topic_arg(args.topic, config)
    applied = applied_policy(config, topic)
    if args.json:
        print(json.dumps({k: {"value": v, "level": lvl} for k, (v, lvl) in applied.items()}, indent=2))
        return 0
    print(f"offload policy of {topic} ({path})")
    width = max(len(k) for k in applied)
    for key, (value, level) in applied.items():
        print(f"  {key:<{width}}  {value!s:<14}  {level}")
    return 0
