"""``streamoffload policy TOPIC``: the offload policy a topic-partition gets, and where each value came from
(like ``pulsar-admin topics get-offload-policies --applied``). ``streamoffload policy import FILE``: the JSON
``pulsar-admin namespaces|topics get-offload-policies`` prints (Pulsar's ``OffloadPoliciesImpl``) as this
file's TOML, in our names (``streamoffload.pulsar_names``), each field it cannot use named on stderr."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from dataclasses import field as default
from pathlib import Path
from typing import Any

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.cli_common import config_from_args, topic_arg
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.config import DRIVERS, Config, file_system_root, parse_config
from streamoffload.errors import ConfigError
from streamoffload.pulsar_names import REFUSED, THRESHOLD_PROBLEM

EPILOG = """\
examples:
  streamoffload policy --conf conf/streamoffload.toml persistent://public/default/orders
  streamoffload policy --conf prod.toml orders-partition-3 --json
  pulsar-admin namespaces get-offload-policies tenant/ns | streamoffload policy import - --namespace tenant/ns
  streamoffload policy import applied.json > imported.toml    # [store] and [offload], to merge into yours

Levels, most specific last: default (built in), broker ([offload]), namespace ([namespaces."t/ns"]),
topic ([topics."persistent://t/ns/topic"], which its partitions inherit), partition.

`policy import FILE` (`-`: stdin) prints the TOML of a get-offload-policies JSON: [store] and [offload] by
default, or one [namespaces."t/ns"] (--namespace) or [topics."..."] (--topic) section, whose store fields are
not imported (one store per job). Each field it does not import is named on stderr with the reason.
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
    parser.add_argument("--conf", metavar="FILE", help="TOML configuration file (required to show a policy)")
    parser.add_argument("topic", metavar="TOPIC | import", help="topic or topic-partition; or import FILE")
    parser.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="import: get-offload-policies JSON, or a broker.conf offload block ('-': stdin)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object: key -> {value, level}")
    target = parser.add_argument_group("import into (default: [store] and [offload])").add_mutually_exclusive_group()
    target.add_argument("--namespace", metavar="TENANT/NS", help='a [namespaces."TENANT/NS"] section')
    target.add_argument("--topic", dest="import_topic", metavar="TOPIC", help='a [topics."TOPIC"] section')
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
    if args.topic == "import":
        return run_import(args)
    if args.file is not None or args.namespace or args.import_topic:
        raise ConfigError("FILE, --namespace and --topic go with `policy import FILE`")
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


# --- policy import ---------------------------------------------------------------------------------------

_STORE_FIELDS = {
    # Pulsar's field -> our [store] key. Where a driver-neutral field and an s3 one are both set, the neutral one
    # wins, as in Pulsar's offloaders.
    "managedLedgerOffloadDriver": "managedLedgerOffloadDriver",
    "managedLedgerOffloadBucket": "bucket",
    "s3ManagedLedgerOffloadBucket": "bucket",
    "managedLedgerOffloadRegion": "region",
    "s3ManagedLedgerOffloadRegion": "region",
    "managedLedgerOffloadServiceEndpoint": "serviceEndpoint",
    "s3ManagedLedgerOffloadServiceEndpoint": "serviceEndpoint",
    "fileSystemURI": "root",
}
_POLICY_FIELDS = {
    "managedLedgerOffloadDeletionLagInMillis": "managedLedgerOffloadDeletionLagMs",
    "managedLedgerOffloadMaxBlockSizeInBytes": "managedLedgerOffloadMaxBlockSizeInBytes",
    "s3ManagedLedgerOffloadMaxBlockSizeInBytes": "managedLedgerOffloadMaxBlockSizeInBytes",
    "managedLedgerOffloadReadBufferSizeInBytes": "managedLedgerOffloadReadBufferSizeInBytes",
    "s3ManagedLedgerOffloadReadBufferSizeInBytes": "managedLedgerOffloadReadBufferSizeInBytes",
}
_BROKER_SIDE = "the broker's own offloader (its NAR directory, threads, read-ahead); the job sizes its own work"
_NOT_IMPORTED = {
    "offloadersDirectory": _BROKER_SIDE,
    "managedLedgerOffloadMaxThreads": _BROKER_SIDE,
    "managedLedgerOffloadPrefetchRounds": _BROKER_SIDE,
    "managedLedgerOffloadedReadPriority": (
        "the broker's choice of where to read; readers here read the store wherever it holds an entry"
    ),
    "managedLedgerExtraConfigurations": "extra settings of the broker's own offloader",
    "s3Driver": "derived from managedLedgerOffloadDriver",
    "gcsDriver": "derived from managedLedgerOffloadDriver",
    "fileSystemDriver": "derived from managedLedgerOffloadDriver",
    "s3ManagedLedgerOffloadRoleSessionName": "credentials come from the AWS chain (environment, profile, role)",
    "managedLedgerOffloadThresholdInSeconds": (
        "Pulsar's age threshold for automatic offload; this job offloads every entry continuously"
    ),
    **{name: reason for (section, name), reason in REFUSED.items() if section == "store"},
}
_GCS = "Google Cloud Storage is not a store this job writes (filesystem, aws-s3, s3)"


TomlValue = str | int | float | bool
"""What a key of ours holds after an import."""
PulsarJson = Mapping[str, object]
"""A get-offload-policies document: field -> value, as ``json`` decodes it."""


@dataclass
class ImportedPolicy:
    """What ``get-offload-policies`` JSON says in our terms: ``[store]`` keys, the policy keys of the target
    section, and ``(field, reason)`` for each field not imported."""

    store: dict[str, TomlValue] = default(default_factory=dict)
    policy: dict[str, TomlValue] = default(default_factory=dict)
    skipped: list[tuple[str, str]] = default(default_factory=list)
    notes: list[str] = default(default_factory=list)
    """What was imported with a meaning worth saying (a threshold of -1 is enabled = false)."""


def _chosen(doc: PulsarJson, names: list[str]) -> str | None:
    """Of Pulsar's fields for one key of ours, the one that counts: the driver-neutral one where it is set (as
    Pulsar's offloaders read them), else the s3 one."""
    present = [name for name in names if doc.get(name) is not None]
    neutral = [name for name in present if not name.startswith("s3")]
    chosen = neutral or present
    return chosen[0] if chosen else None


_S3_STORE_KEYS = ("bucket", "region", "serviceEndpoint")


def _applies(name: str, key: str, driver: str | None) -> bool:
    """Whether Pulsar's field ``name`` (our ``key``) is read by the offloader of ``driver`` (unknown: any): the s3
    fields and the bucket's by an S3 one only, ``fileSystemURI`` by the filesystem one only. Pulsar prints its s3
    defaults (block and read buffer sizes) whatever the driver, and a topic's applied policy the namespace's
    bucket beside the topic's filesystem driver."""
    if driver is None or driver not in DRIVERS:
        return True
    if driver == "filesystem":
        return not name.startswith("s3") and key not in _S3_STORE_KEYS
    return key != "root"


def _counts(threshold: object) -> bool:
    """Whether a Pulsar offload threshold triggers offloading (0 or more; -1 and unset do not)."""
    return isinstance(threshold, int) and threshold >= 0


def translate_offload_policies(doc: PulsarJson, *, store_allowed: bool = True) -> ImportedPolicy:
    """``doc`` (Pulsar's ``OffloadPoliciesImpl`` as JSON) in our keys. ``store_allowed``: False for a namespace's
    or a topic's section, where a store field cannot apply (one store per job)."""
    out = ImportedPolicy()
    driver = doc.get("managedLedgerOffloadDriver")
    driver = driver.lower() if isinstance(driver, str) else None
    for fields_of, table in ((_STORE_FIELDS, out.store), (_POLICY_FIELDS, out.policy)):
        for key in dict.fromkeys(fields_of.values()):
            names = [name for name, ours in fields_of.items() if ours == key]
            unused = [name for name in names if doc.get(name) is not None and not _applies(name, key, driver)]
            out.skipped.extend((name, f"not used by the {driver} driver (Pulsar prints it anyway)") for name in unused)
            names = [name for name in names if name not in unused]
            chosen = _chosen(doc, names)
            if chosen is None:
                continue
            for name in names:
                if name != chosen and doc.get(name) is not None and doc[name] != doc[chosen]:
                    out.skipped.append(
                        (
                            name,
                            f"{doc[name]!r}, but {chosen} = {doc[chosen]!r} wins "
                            "(the driver-neutral field, as in Pulsar)",
                        )
                    )
            value = doc[chosen]
            if not isinstance(value, str | int | float):
                out.skipped.append((chosen, f"{value!r} is not a string or a number"))
                continue
            if table is out.store and not store_allowed:
                out.skipped.extend((n, "a store setting: one store per job, in [store]") for n in names if n in doc)
                continue
            if key == "managedLedgerOffloadDriver":
                if not isinstance(value, str) or value.lower() not in DRIVERS:
                    out.skipped.append((chosen, f"driver {value!r}: this job writes {', '.join(DRIVERS)} stores"))
                    continue
                value = value.lower()
            elif key == "root":
                value = file_system_root(value, chosen, "get-offload-policies")
            table[key] = value
    known = {*_STORE_FIELDS, *_POLICY_FIELDS}
    for name, value in doc.items():
        if value is None or name in known:
            continue  # None: not set (Pulsar prints set fields only)
        if name == "managedLedgerOffloadThresholdInBytes":
            if not isinstance(value, int) or isinstance(value, bool) or value > 0:
                out.skipped.append((name, f"{value!r} {THRESHOLD_PROBLEM}"))
            elif value < 0 and _counts(doc.get("managedLedgerOffloadThresholdInSeconds")):
                out.skipped.append((name, "-1, but managedLedgerOffloadThresholdInSeconds offloads by age"))
            else:
                out.policy["enabled"] = value == 0
                if value < 0:
                    out.notes.append(
                        f"{name} = {value} (Pulsar: no automatic offload) is imported as enabled = false: this "
                        "job offloads nothing under it; leave that line out to offload"
                    )
        elif name in _NOT_IMPORTED:
            out.skipped.append((name, _NOT_IMPORTED[name]))
        elif name.startswith("gcs"):
            out.skipped.append((name, _GCS))
        else:
            out.skipped.append((name, "not a field of Pulsar's OffloadPolicies"))
    out.skipped.sort()
    return out


def _toml_value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    # A JSON string is a TOML basic string: the same escapes (\", \\, \n, \uXXXX).
    return json.dumps(str(value), ensure_ascii=False)


def _toml_table(header: str, table: Mapping[str, TomlValue]) -> list[str]:
    return [header, *(f"{key} = {_toml_value(value)}" for key, value in table.items()), ""]


def import_toml(imported: ImportedPolicy, *, namespace: str | None = None, topic: str | None = None) -> str:
    """The TOML of ``imported``: ``[store]`` and ``[offload]``, or the policy as one namespace's or topic's
    section."""
    lines: list[str] = []
    if namespace is not None:
        lines += _toml_table(f"[namespaces.{json.dumps(namespace)}]", imported.policy)
    elif topic is not None:
        lines += _toml_table(f"[topics.{json.dumps(topic)}]", imported.policy)
    else:
        if imported.store:
            lines += _toml_table("[store]", imported.store)
        lines += _toml_table("[offload]", imported.policy)
    return "\n".join(lines)


class PolicyImportError(ConfigError):
    """A get-offload-policies document that cannot be imported."""


def _refuse_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number JSON allows")


BROKER_CONF_FIELDS = {
    # broker.conf's key -> OffloadPolicies' field, where they differ (the others are spelled alike).
    "managedLedgerOffloadDeletionLagMs": "managedLedgerOffloadDeletionLagInMillis",
    "managedLedgerOffloadAutoTriggerSizeThresholdBytes": "managedLedgerOffloadThresholdInBytes",
}


def broker_conf_policies(text: str, where: str) -> dict[str, object]:
    """A ``broker.conf`` (or ``standalone.conf``) offload block, Java properties as Pulsar reads them (``key=value``,
    ``#``/``!`` comments), as the fields of Pulsar's OffloadPolicies: broker.conf's names that differ renamed
    (``BROKER_CONF_FIELDS``), integers and booleans typed, and an empty value unset (as Pulsar reads it)."""
    doc: dict[str, object] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*(?:[=:]\s*|\s+|$)(.*)", line)
        if match is None:
            raise PolicyImportError(f"{where}:{number}: not a broker.conf line (key=value): {line!r:.60}")
        key, value = match.group(1), match.group(2).strip()
        if not value:
            continue
        typed: object = value
        if re.fullmatch(r"-?\d+", value):
            typed = int(value)
        elif value.lower() in ("true", "false"):
            typed = value.lower() == "true"
        doc[BROKER_CONF_FIELDS.get(key, key)] = typed
    return doc


def read_offload_policies(path: str) -> dict[str, object]:
    """The get-offload-policies JSON object of ``path`` (``-``: stdin), or its ``broker.conf`` offload block
    (:func:`broker_conf_policies`) where it is not JSON (it does not start with ``{``)."""
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyImportError(f"{where}: cannot read it: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise PolicyImportError(f"{where}: not UTF-8 text (byte {err.start})") from None
    if re.match(r"\s*[A-Za-z_#!]", text) and not re.match(r"\s*(null|true|false|NaN|Infinity)\b", text):
        return broker_conf_policies(text, where)
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as err:
        raise PolicyImportError(f"{where}: not get-offload-policies JSON: {err}") from None
    if not isinstance(doc, dict):
        raise PolicyImportError(
            f"{where}: expected the JSON object get-offload-policies prints, got {text.strip()!r:.60}"
        )
    bad = [k for k, v in doc.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise PolicyImportError(f"{where}: {bad[0]} is not a finite number")
    return doc


def run_import(args: argparse.Namespace) -> int:
    if args.file is None:
        raise PolicyImportError("policy import: give FILE (the get-offload-policies JSON; '-' for stdin)")
    if args.conf or args.json:
        raise PolicyImportError("policy import takes FILE and --namespace or --topic, not --conf or --json")
    namespace = args.namespace
    if namespace is not None and (namespace.count("/") != 1 or not all(namespace.split("/"))):
        raise PolicyImportError(f"--namespace {namespace!r}: a namespace is written tenant/namespace")
    topic = None
    if args.import_topic is not None:
        try:
            topic = str(TopicName.parse(args.import_topic))
        except TopicNameError as err:
            raise PolicyImportError(f"--topic: {err}") from None
    doc = read_offload_policies(args.file)
    imported = translate_offload_policies(doc, store_allowed=namespace is None and topic is None)
    text = import_toml(imported, namespace=namespace, topic=topic)
    # What is printed loads: a value our rules refuse (a block too small for the broker's largest entry) is
    # said now, naming its field, and not when the job starts.
    parse_config(tomllib.loads(text), f"{'stdin' if args.file == '-' else args.file} (imported)")
    for name, reason in imported.skipped:
        print(f"streamoffload policy import: not imported: {name}: {reason}", file=sys.stderr)
    for note in imported.notes:
        print(f"streamoffload policy import: note: {note}", file=sys.stderr)
    sys.stdout.write(text)
    return 0
