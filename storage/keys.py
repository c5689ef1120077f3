"""Object keys: where each topic-partition's objects live in a store (layout in docs/DESIGN.md).

```
<prefix>/<tenant>/<namespace>/<local-name>/      the topic directory, each component encoded
    <uuid> | <uuid>-index                        v2 (streaming) data and index objects
    <uuid>-ledger-<id> | <uuid>-ledger-<id>-index  v1 (ledger-based) data and index objects
    <data object name>-crc-<n>                   the recorded entry checksums of the data object's n-th block
    _meta/segments/<startLedger:020d>-<startEntry:020d>-<uuid>   segment manifests
    _meta/commits/<ordinal:020d>       the commit of the topic's n-th segment (create-only)
    _meta/failures/<uuid>              the last failure of an unfinished segment attempt
    _meta/deleted/<ledgerId:020d>      a ledger deleted by ``delete-ledger``
    _meta/deleted-segments/<uuid>      what retention or ``delete-ledger`` deleted of a segment
    _meta/deleted-summary/<seq:020d>   create-only totals of folded deleted-segment records
<prefix>/_meta/writers/<epoch:020d>              the writer lease of the whole prefix (checkpoints.lease)
<prefix>/_meta/policies/<effectiveMs:020d>       offload policy versions (streaming.governance.policy_versions)
<prefix>/_meta/quarantine/<sha256 of topic>      a failing topic's record (streaming.governance.quarantine)
<prefix>/_meta/health/job                        the running job's health: its broker unreachable (streaming.job.health)
<prefix>/_control/requests/<id>                  offload-now requests (checkpoints.control_requests)
<prefix>/_control/status/<id>                    what became of them
_iceberg/catalog.db, _iceberg/warehouse/         a filesystem store's Iceberg tables, by default (streamoffload.table)
```

Each topic-name component is percent-encoded (UTF-8, uppercase hex) for every character outside
``[A-Za-z0-9-]``, so an encoded component is never empty, never ``.`` or ``..``, never holds ``/`` and
never starts with ``.`` or ``_``: no topic name can reach outside its directory, into another topic's, or
into ``_meta``/``_control``, and the encoding is one-to-one (``parse_topic_dir`` inverts it exactly).

Pure: no I/O except ``list_topic_dirs``, which takes a store.
"""

from __future__ import annotations

import re
import uuid as uuid_module
from typing import TYPE_CHECKING

from streamoffload.codecs.positions import MAX_ID
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.storage.base import InvalidKeyError

if TYPE_CHECKING:
    from streamoffload.storage.location import ScopedStore

INDEX_SUFFIX = "-index"
CHECKSUMS_INFIX = "-crc-"
FRAMES_INFIX = "-frames-"
LEDGER_INFIX = "-ledger-"
META_DIR = "_meta"
SEGMENTS_DIR = f"{META_DIR}/segments"
COMMITS_DIR = f"{META_DIR}/commits"
FAILURES_DIR = f"{META_DIR}/failures"
DELETED_DIR = f"{META_DIR}/deleted"
DELETED_SEGMENTS_DIR = f"{META_DIR}/deleted-segments"
DELETED_SUMMARY_DIR = f"{META_DIR}/deleted-summary"
CONTROL_DIR = "_control"
TABLES_DIR = "_iceberg"
"""A filesystem store's default SQLite catalog and warehouse of its Iceberg tables (``streamoffload.table.catalog``):
not objects of the store (no topic directory starts with ``_``), written by pyiceberg."""
# Kinds of metadata of a whole prefix (prefix_meta_prefix) and of control objects (control_prefix).
WRITERS = "writers"
POLICIES = "policies"
QUARANTINE = "quarantine"
HEALTH = "health"
CONTROL_REQUESTS = "requests"
CONTROL_STATUS = "status"

# Object user metadata: Pulsar's readers require this key, when present, to say format version 1.
FORMAT_VERSION_METADATA_KEY = "s3managedledgeroffloaderformatversion"
SUPPORTED_FORMAT_VERSION = "1"
_LEDGER_IN_KEY = re.compile(r"-ledger-(\d+)(?:-index)?$")

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_ENCODED_RE = re.compile(r"^(?:[A-Za-z0-9-]|%[0-9A-F]{2})+$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MANIFEST_RE = re.compile(r"^(\d{20})-(\d{20})-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_DELETED_RE = re.compile(r"^\d{20}$")
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


# --- key validation (shared by every store) ---------------------------------------------------------


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``InvalidKeyError`` naming it.

    Valid: non-empty ``/``-separated components, none empty, ``.``/``..`` or starting with ``.`` (names
    starting with ``.`` are the filesystem store's own: temporary files, metadata, multipart staging),
    no backslash, no NUL or other control character, at most 1024 UTF-8 bytes (S3's limit).
    """
    if not isinstance(key, str):
        raise InvalidKeyError(repr(key), f"keys are str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(key, "empty key")
    if key.startswith("/"):
        raise InvalidKeyError(key, "absolute keys are not allowed (keys are relative to the store root)")
    if "\\" in key:
        raise InvalidKeyError(key, "backslashes are not allowed")
    if _CONTROL_CHARACTER.search(key):
        raise InvalidKeyError(key, "NUL and other control characters are not allowed")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(key, "not encodable as UTF-8") from exc
    if size > 1024:
        raise InvalidKeyError(key, f"{size} bytes long, more than 1024")
    for component in key.split("/"):
        if not component:
            raise InvalidKeyError(key, "empty path component ('//' or a trailing '/')")
        if component in (".", ".."):
            raise InvalidKeyError(key, f"{component!r} path components are not allowed")
        if component.startswith("."):
            raise InvalidKeyError(key, f"component {component!r} starts with '.', which is reserved")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a valid key (``""``, ``"a/"``, ``"a/b"``), else raise ``InvalidKeyError``."""
    if prefix == "":
        return prefix
    # A prefix may stop inside a component or right after a '/': check it as the start of a real key.
    try:
        check_key(prefix + "x" if prefix.endswith("/") else prefix)
    except InvalidKeyError as exc:
        raise InvalidKeyError(prefix, exc.reason) from None
    return prefix


# --- topic directories ------------------------------------------------------------------------------


def encode_component(text: str) -> str:
    """Percent-encode one topic-name component (every UTF-8 byte outside ``[A-Za-z0-9-]``)."""
    if not text:
        raise TopicNameError("empty topic-name component cannot be used in an object key")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TopicNameError(f"topic-name component {text!r} is not valid unicode") from exc
    return "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in raw)


def decode_component(encoded: str) -> str:
    """Inverse of ``encode_component``; refuses anything it would not have produced."""
    if not _ENCODED_RE.match(encoded):
        raise TopicNameError(f"{encoded!r} is not an encoded topic-name component")
    out = bytearray()
    i = 0
    while i < len(encoded):
        if encoded[i] == "%":
            byte = int(encoded[i + 1 : i + 3], 16)
            if chr(byte) in _SAFE:
                raise TopicNameError(f"{encoded!r}: {encoded[i : i + 3]} encodes a character that is never encoded")
            out.append(byte)
            i += 3
        else:
            out.append(ord(encoded[i]))
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopicNameError(f"{encoded!r} does not decode to UTF-8 text") from exc


def _norm_prefix(prefix: str) -> str:
    """The key prefix without surrounding slashes, validated (``""`` for none)."""
    text = prefix.strip("/")
    if text:
        check_key(text)
    return text


def _topic(topic: TopicName | str) -> TopicName:
    name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    if name.domain != "persistent":
        # Non-persistent topics have no ledgers to offload; refusing them also keeps the (domain-less)
        # directory of persistent://t/n/x distinct from that of non-persistent://t/n/x.
        raise TopicNameError(f"topic {name}: only persistent topics are offloaded")
    return name


def topic_dir(prefix: str, topic: TopicName | str) -> str:
    """``<prefix>/<tenant>/<namespace>/<local-name>/`` with each topic component encoded (no leading
    ``/`` when ``prefix`` is empty). Ends with ``/``."""
    name = _topic(topic)
    parts = [encode_component(name.tenant), encode_component(name.namespace), encode_component(name.local_name)]
    base = _norm_prefix(prefix)
    return "/".join([base, *parts] if base else parts) + "/"


def parse_topic_dir(key: str, prefix: str | None = None) -> TopicName:
    """The topic whose directory ``key`` is (inverse of ``topic_dir``).

    With ``prefix``, ``key`` must be exactly ``topic_dir(prefix, t)`` (trailing ``/`` optional); without,
    the last three components of ``key`` are taken as tenant, namespace and local name.
    Raises ``TopicNameError`` for anything ``topic_dir`` could not have produced.
    """
    body = key[:-1] if key.endswith("/") else key
    if prefix is not None:
        base = _norm_prefix(prefix)
        if base:
            if not body.startswith(base + "/"):
                raise TopicNameError(f"key {key!r} is not under prefix {base!r}")
            body = body[len(base) + 1 :]
        parts = body.split("/")
        if len(parts) != 3:
            raise TopicNameError(f"key {key!r} is not a topic directory under prefix {base!r}")
    else:
        parts = body.split("/")[-3:]
        if len(parts) != 3:
            raise TopicNameError(f"key {key!r} has fewer than three components")
    tenant, namespace, local = (decode_component(p) for p in parts)
    return TopicName("persistent", tenant, namespace, local)


# --- object keys inside a topic directory -----------------------------------------------------------


def _uuid_text(value: str | uuid_module.UUID) -> str:
    try:
        parsed = value if isinstance(value, uuid_module.UUID) else uuid_module.UUID(str(value))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a UUID") from exc
    return str(parsed)  # lowercase, hyphenated


def _id(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise ValueError(f"{what} must be an integer in [0, 2^63), got {value!r}")
    return value


def data_name(uuid: str | uuid_module.UUID, *, ledger_id: int | None = None) -> str:
    """The object name of a data object: v2 ``<uuid>``, v1 ``<uuid>-ledger-<ledgerId>``."""
    text = _uuid_text(uuid)
    return text if ledger_id is None else f"{text}{LEDGER_INFIX}{_id(ledger_id, 'ledger id')}"


def data_key(prefix: str, topic: TopicName | str, uuid: str | uuid_module.UUID, *, ledger_id: int | None = None) -> str:
    """Key of a segment's data object (v2 without ``ledger_id``, v1 with it)."""
    return topic_dir(prefix, topic) + data_name(uuid, ledger_id=ledger_id)


def index_key(
    prefix: str, topic: TopicName | str, uuid: str | uuid_module.UUID, *, ledger_id: int | None = None
) -> str:
    """Key of the index object belonging to ``data_key(prefix, topic, uuid, ledger_id=...)``."""
    return data_key(prefix, topic, uuid, ledger_id=ledger_id) + INDEX_SUFFIX


def index_key_for(data_object_key: str) -> str:
    """The index key of a data object key."""
    return data_object_key + INDEX_SUFFIX


def block_checksums_prefix(data_object_key: str) -> str:
    """List prefix of the block checksum records of a data object (``<data key>-crc-``)."""
    return data_object_key + CHECKSUMS_INFIX


def block_checksums_key(data_object_key: str, block: int) -> str:
    """``<data key>-crc-<n>``: the recorded CRC-32C of every entry of the data object's ``block``-th block
    (1-based, in object order; the index's part id of the block). ``codecs.checksums`` is its format."""
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= MAX_BLOCK_ORDINAL:
        raise ValueError(f"block ordinal must be an integer in [1, {MAX_BLOCK_ORDINAL}], got {block!r}")
    return block_checksums_prefix(data_object_key) + str(block)


MAX_BLOCK_ORDINAL = 2**32 - 1
"""An index records a block's part id as a u32."""


def part_frames_prefix(data_object_key: str) -> str:
    """List prefix of the part frame records of a compressed data object (``<data key>-frames-``)."""
    return data_object_key + FRAMES_INFIX


def part_frames_key(data_object_key: str, part: int) -> str:
    """``<data key>-frames-<n>``: where the frames of the data object's ``part``-th part lie
    (``codecs.block_frames.PartFrames``), written with the part and joined into the manifest by the seal."""
    if isinstance(part, bool) or not isinstance(part, int) or not 1 <= part <= MAX_PART_NUMBER:
        raise ValueError(f"part number must be an integer in [1, {MAX_PART_NUMBER}], got {part!r}")
    return part_frames_prefix(data_object_key) + str(part)


MAX_PART_NUMBER = 2**31 - 1
"""Part numbers are positive ints (S3 stops at 10,000; a filesystem store does not)."""


def manifests_prefix(prefix: str, topic: TopicName | str) -> str:
    """List prefix of a topic's segment manifests (they list in start-position order)."""
    return topic_dir(prefix, topic) + SEGMENTS_DIR + "/"


def manifest_key(
    prefix: str, topic: TopicName | str, start_ledger: int, start_entry: int, uuid: str | uuid_module.UUID
) -> str:
    """``.../_meta/segments/<startLedger:020d>-<startEntry:020d>-<uuid>``."""
    name = f"{_id(start_ledger, 'start ledger'):020d}-{_id(start_entry, 'start entry'):020d}-{_uuid_text(uuid)}"
    return manifests_prefix(prefix, topic) + name


def parse_manifest_name(key: str) -> tuple[int, int, str]:
    """``(start_ledger, start_entry, uuid)`` from a manifest key (or its last component)."""
    name = key.rsplit("/", 1)[-1]
    match = _MANIFEST_RE.match(name)
    if not match:
        raise ValueError(f"{key!r} is not a segment manifest key (<ledger:020d>-<entry:020d>-<uuid>)")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def commits_prefix(prefix: str, topic: TopicName | str) -> str:
    """List prefix of a topic's segment commits (they list in ordinal, hence position, order)."""
    return topic_dir(prefix, topic) + COMMITS_DIR + "/"


def commit_key(prefix: str, topic: TopicName | str, ordinal: int) -> str:
    """``.../_meta/commits/<ordinal:020d>``: written create-only, so one segment wins each place in a
    topic's history whatever the number of writers."""
    return commits_prefix(prefix, topic) + f"{_id(ordinal, 'segment ordinal'):020d}"


def parse_commit_name(key: str) -> int:
    """The ordinal of a commit key (or its last component)."""
    name = key.rsplit("/", 1)[-1]
    if not _DELETED_RE.match(name):
        raise ValueError(f"{key!r} is not a segment commit key (<ordinal:020d>)")
    return int(name)


def failure_key(prefix: str, topic: TopicName | str, uuid: str | uuid_module.UUID) -> str:
    """``.../_meta/failures/<uuid>``: why the last attempt at an unfinished segment failed."""
    return topic_dir(prefix, topic) + f"{FAILURES_DIR}/{_uuid_text(uuid)}"


def failures_prefix(prefix: str, topic: TopicName | str) -> str:
    return topic_dir(prefix, topic) + FAILURES_DIR + "/"


def prefix_meta_prefix(prefix: str, kind: str) -> str:
    """``<prefix>/_meta/<kind>/``: metadata of the whole prefix (``writers``, ``policies``). Topic
    directories are three encoded components deep and never start with ``_``, so these cannot collide."""
    return _prefix_dir(prefix, META_DIR, _name(kind, "metadata kind"))


def _prefix_dir(prefix: str, directory: str, kind: str) -> str:
    """``<prefix>/<directory>/<kind>/``, a directory of the whole prefix beside the topic directories."""
    base = _norm_prefix(prefix)
    return (base + "/" if base else "") + f"{directory}/{kind}/"


def deleted_marks_prefix(prefix: str, topic: TopicName | str) -> str:
    """List prefix of a topic's deleted-ledger marks (they list in ledger-id order)."""
    return topic_dir(prefix, topic) + DELETED_DIR + "/"


def deleted_mark_key(prefix: str, topic: TopicName | str, ledger_id: int) -> str:
    """``.../_meta/deleted/<ledgerId:020d>``."""
    return deleted_marks_prefix(prefix, topic) + f"{_id(ledger_id, 'ledger id'):020d}"


def parse_deleted_mark(key: str) -> int:
    """The ledger id of a deleted-ledger mark key (or its last component)."""
    name = key.rsplit("/", 1)[-1]
    if not _DELETED_RE.match(name):
        raise ValueError(f"{key!r} is not a deleted-ledger mark key (<ledgerId:020d>)")
    return int(name)


def _name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value) or len(value) > 200:
        raise ValueError(f"{what} {value!r} must be 1-200 characters of [A-Za-z0-9._-] starting with a letter or digit")
    return value


def control_prefix(prefix: str, kind: str) -> str:
    """``<prefix>/_control/<kind>/``: offload-now requests (``requests``) and what became of them (``status``)."""
    return _prefix_dir(prefix, CONTROL_DIR, _name(kind, "control kind"))


def deleted_segments_prefix(prefix: str, topic: TopicName | str) -> str:
    """``.../_meta/deleted-segments/``: what retention or ``delete-ledger`` deleted, one record per segment."""
    return topic_dir(prefix, topic) + DELETED_SEGMENTS_DIR + "/"


def deleted_summary_prefix(prefix: str, topic: TopicName | str) -> str:
    """``.../_meta/deleted-summary/``: create-only versions of the totals of folded deleted-segment records."""
    return topic_dir(prefix, topic) + DELETED_SUMMARY_DIR + "/"


# --- discovery --------------------------------------------------------------------------------------


def list_topic_dirs(scoped: ScopedStore) -> list[TopicName]:
    """Topics that have at least one object under the scoped store's prefix, sorted.

    Keys that are not inside a well-formed topic directory are ignored. (The store interface lists
    whole keys, so this reads every key under the prefix once.)
    """
    store = scoped.store
    base = _norm_prefix(scoped.prefix)
    start = base + "/" if base else ""
    found: dict[str, TopicName] = {}
    for info in store.list(start):
        parts = info.key[len(start) :].split("/")
        if len(parts) < 4:
            continue
        directory = "/".join(parts[:3])
        if directory in found:
            continue
        try:
            found[directory] = parse_topic_dir(directory, prefix="")
        except TopicNameError:
            continue
    return sorted(found.values())


# --- limits -----------------------------------------------------------------------------------------


def ledger_id_in_key(key: str | None) -> int | None:
    """The ledger id a v1 object key or file name carries (``<uuid>-ledger-<N>`` or ``...-index``), if any."""
    match = _LEDGER_IN_KEY.search(key) if key else None
    return int(match.group(1)) if match else None


MAX_COMPONENT_BYTES = 255
"""A directory name (each encoded topic-name component) on the filesystem store: NAME_MAX."""
MAX_KEY_BYTES = 1024
"""S3's key limit (``check_key`` enforces it for every store)."""


class TopicTooLongError(TopicNameError):
    """A topic whose objects the store cannot hold: its directory name or its keys are too long."""


def longest_keys(prefix: str, topic: TopicName | str) -> list[str]:
    """The longest keys the job writes for ``topic`` under ``prefix``: a manifest, a v1 index object, a v1
    block checksum record and a deleted-ledger mark with the largest ids (ids are Java longs, zero-padded to
    20 digits in names)."""
    sample = uuid_module.UUID(int=0)
    biggest = MAX_ID
    return [
        manifest_key(prefix, topic, biggest, biggest, sample),
        index_key(prefix, topic, sample, ledger_id=biggest),
        block_checksums_key(data_key(prefix, topic, sample, ledger_id=biggest), MAX_BLOCK_ORDINAL),
        deleted_mark_key(prefix, topic, biggest),
    ]


def check_topic_fits(prefix: str, topic: TopicName | str) -> TopicName:
    """``topic``, parsed, if the store can hold its objects under ``prefix``; else ``TopicTooLongError``.

    Each encoded component of the topic directory must fit a directory name (255 bytes) and the longest
    key written under it (see ``longest_keys``) S3's 1024 bytes. Call it for every topic before writing
    any object of it: a topic that does not fit then fails alone, at once, with this message, instead of
    failing every batch that holds one of its entries. Raises ``TopicNameError`` for non-persistent
    topics and ``InvalidKeyError`` for a malformed ``prefix``.
    """
    name = _topic(topic)
    for label, text in (("tenant", name.tenant), ("namespace", name.namespace), ("local name", name.local_name)):
        size = len(encode_component(text).encode("ascii"))
        if size > MAX_COMPONENT_BYTES:
            raise TopicTooLongError(
                f"topic {name}: its {label} is {size} bytes once encoded for the store (each byte outside "
                f"[A-Za-z0-9-] takes 3), more than the {MAX_COMPONENT_BYTES} a directory name can hold"
            )
    longest = max(longest_keys(prefix, name), key=lambda k: len(k.encode("utf-8")))
    size = len(longest.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        where = f" under prefix {prefix.strip('/')!r}" if prefix.strip("/") else ""
        raise TopicTooLongError(
            f"topic {name}: its longest object key{where} would be {size} bytes, more than the "
            f"{MAX_KEY_BYTES} S3 allows; use a shorter topic name or store prefix"
        )
    return name
