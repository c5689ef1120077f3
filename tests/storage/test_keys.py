"""Object keys from topic names: no topic name can reach outside its own directory or collide with another's."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.storage import keys
from streamoffload.storage.base import InvalidKeyError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore

NASTY = [
    "..",
    ".",
    "...",
    "/",
    "a/b",
    "../../etc/passwd",
    "%2F",
    "a%2Fb",
    "%",
    "%%",
    "%2e%2e",
    "_meta",
    "_control",
    ".hidden",
    "-partition-0",
    " ",
    "sp ace",
    "caf\u00e9",
    "\u6587\u5b57",
    "\U0001f600",
    "a\x00b",
    "back\\slash",
    "A",
    "a",
    "trailing/",
    "t-partition-3",
]

components = st.one_of(st.sampled_from(NASTY), st.text(min_size=1, max_size=24))
topics = st.builds(lambda t, n, loc: TopicName("persistent", t, n, loc), components, components, components)
prefixes = st.sampled_from(["", "offload", "a/b", "/slashes/around/"])

UUID = uuid.UUID("12345678-9abc-4def-8123-456789abcdef")
_COMPONENT_RE = re.compile(r"^(?:[A-Za-z0-9-]|%[0-9A-F]{2})+$")


def _tail(prefix: str, key: str) -> str:
    base = prefix.strip("/")
    head = base + "/" if base else ""
    assert key.startswith(head)
    return key[len(head) :]


@settings(max_examples=200, deadline=None)
@given(prefixes, topics)
def test_topic_dir_is_three_safe_components_under_the_prefix(prefix: str, topic: TopicName) -> None:
    directory = keys.topic_dir(prefix, topic)
    assert directory.endswith("/")
    parts = _tail(prefix, directory)[:-1].split("/")
    assert len(parts) == 3
    for part in parts:
        assert _COMPONENT_RE.match(part), part
        assert part not in (".", "..")
        assert not part.startswith((".", "_"))
    for key in (
        keys.data_key(prefix, topic, UUID),
        keys.index_key(prefix, topic, UUID, ledger_id=7),
        keys.manifest_key(prefix, topic, 3, 4, UUID),
        keys.deleted_mark_key(prefix, topic, 9),
        keys.deleted_segments_prefix(prefix, topic) + "x",
        keys.deleted_summary_prefix(prefix, topic) + "x",
    ):
        assert key.startswith(directory)
        keys.check_key(key)  # valid in every store
        assert os.path.normpath(key).startswith(directory.rstrip("/"))


@settings(max_examples=200, deadline=None)
@given(prefixes, topics)
def test_parse_topic_dir_inverts_topic_dir(prefix: str, topic: TopicName) -> None:
    directory = keys.topic_dir(prefix, topic)
    assert keys.parse_topic_dir(directory, prefix) == topic
    assert keys.parse_topic_dir(directory) == topic
    assert keys.parse_topic_dir(directory.rstrip("/"), prefix) == topic


@settings(max_examples=200, deadline=None)
@given(topics, topics)
def test_distinct_topics_get_disjoint_directories(a: TopicName, b: TopicName) -> None:
    dir_a, dir_b = keys.topic_dir("p", a), keys.topic_dir("p", b)
    if a == b:
        assert dir_a == dir_b
    else:
        assert not dir_a.startswith(dir_b)
        assert not dir_b.startswith(dir_a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("a/b", "a%2Fb"),
        ("A", "a"),
        ("x.y", "x%2Ey"),
        ("_meta", "%5Fmeta"),
        ("t", "t-partition-0"),
        ("caf\u00e9", "cafe\u0301"),  # NFC vs NFD: different names stay different
    ],
)
def test_lookalike_names_do_not_collide(a: str, b: str) -> None:
    ta, tb = TopicName("persistent", "t", "n", a), TopicName("persistent", "t", "n", b)
    assert keys.topic_dir("", ta) != keys.topic_dir("", tb)


def test_encoding_examples() -> None:
    assert keys.topic_dir("offload", "persistent://public/default/orders-partition-2") == (
        "offload/public/default/orders-partition-2/"
    )
    assert keys.topic_dir("", "my-topic") == "public/default/my-topic/"
    topic = TopicName("persistent", "ten.ant", "_ns", "../x/caf\u00e9 %")
    assert keys.topic_dir("/p/", topic) == "p/ten%2Eant/%5Fns/%2E%2E%2Fx%2Fcaf%C3%A9%20%25/"


def test_object_names_follow_the_pulsar_layout() -> None:
    topic = "persistent://public/default/t"
    base = "pfx/public/default/t/"
    uid = str(UUID)
    assert keys.data_key("pfx", topic, UUID) == base + uid
    assert keys.index_key("pfx", topic, uid.upper()) == base + uid + "-index"
    assert keys.data_key("pfx", topic, UUID, ledger_id=42) == base + uid + "-ledger-42"
    assert keys.index_key("pfx", topic, UUID, ledger_id=42) == base + uid + "-ledger-42-index"
    assert keys.index_key_for(keys.data_key("pfx", topic, UUID)) == keys.index_key("pfx", topic, UUID)
    assert keys.manifest_key("pfx", topic, 5, 17, UUID) == (base + f"_meta/segments/{5:020d}-{17:020d}-{uid}")
    assert keys.manifests_prefix("pfx", topic) == base + "_meta/segments/"
    assert keys.deleted_mark_key("pfx", topic, 5) == base + f"_meta/deleted/{5:020d}"
    assert keys.deleted_marks_prefix("pfx", topic) == base + "_meta/deleted/"
    assert keys.deleted_segments_prefix("pfx", topic) == base + "_meta/deleted-segments/"
    assert keys.deleted_summary_prefix("pfx", topic) == base + "_meta/deleted-summary/"
    assert keys.control_prefix("pfx/", "requests") == "pfx/_control/requests/"
    assert keys.control_prefix("", "status") == "_control/status/"
    # Block checksum records sit beside their data object; no Pulsar object name ends like them.
    assert keys.block_checksums_key(base + uid, 3) == base + uid + "-crc-3"
    assert keys.block_checksums_key(base + uid + "-ledger-42", 1) == base + uid + "-ledger-42-crc-1"
    assert keys.block_checksums_prefix(base + uid) == base + uid + "-crc-"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.uuids()), min_size=2, max_size=10))
def test_manifest_keys_sort_by_start_position_and_parse_back(starts: list[tuple[int, int, uuid.UUID]]) -> None:
    made = [keys.manifest_key("p", "t", ledger, entry, uid) for ledger, entry, uid in starts]
    parsed = [keys.parse_manifest_name(k) for k in sorted(made)]
    assert parsed == sorted((ledger, entry, str(uid)) for ledger, entry, uid in starts)


def test_deleted_marks_parse_back() -> None:
    assert keys.parse_deleted_mark(keys.deleted_mark_key("p", "t", 123)) == 123
    with pytest.raises(ValueError, match="deleted-ledger mark"):
        keys.parse_deleted_mark("p/x/123")


@pytest.mark.parametrize(
    "call",
    [
        lambda: keys.data_key("p", "t", "not-a-uuid"),
        lambda: keys.data_key("p", "t", UUID, ledger_id=-1),
        lambda: keys.manifest_key("p", "t", 1, 2**63, UUID),
        lambda: keys.deleted_mark_key("p", "t", True),
        lambda: keys.control_prefix("p", "../escape"),
        lambda: keys.control_prefix("p", "a/b"),
        lambda: keys.control_prefix("p", ""),
        lambda: keys.parse_manifest_name("p/_meta/segments/1-2-x"),
        lambda: keys.block_checksums_key("p/t/x", 0),
        lambda: keys.block_checksums_key("p/t/x", 2**32),
    ],
)
def test_bad_key_arguments_are_refused(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_topic_dir_refusals() -> None:
    with pytest.raises(TopicNameError, match="only persistent"):
        keys.topic_dir("p", "non-persistent://public/default/t")
    with pytest.raises(TopicNameError, match="empty"):
        keys.topic_dir("p", TopicName("persistent", "t", "", "x"))
    with pytest.raises(TopicNameError):
        keys.topic_dir("p", TopicName("persistent", "t", "n", "\ud800"))  # lone surrogate: not UTF-8
    with pytest.raises(InvalidKeyError):
        keys.topic_dir("a/../b", "t")


@pytest.mark.parametrize(
    "encoded",
    [
        "public/default/a%2fb",
        "public/default/%41",
        "public/default/a.b",
        "public/default/a%2",
        "public/default/%FF",
        "public/default/",
        "public/x",
    ],
)
def test_parse_topic_dir_refuses_what_topic_dir_cannot_produce(encoded: str) -> None:
    with pytest.raises(TopicNameError):
        keys.parse_topic_dir(encoded, "")


def test_parse_topic_dir_checks_the_prefix() -> None:
    with pytest.raises(TopicNameError, match="not under prefix"):
        keys.parse_topic_dir("other/public/default/t/", "pfx")


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("a", True),
        ("a/b-c_d.e", True),
        ("_meta/x", True),
        ("a" * 1024, True),
        ("a" * 1025, False),
        ("", False),
        ("/a", False),
        ("a/", False),
        ("a//b", False),
        ("a/../b", False),
        ("./a", False),
        (".a", False),
        ("a\\b", False),
        ("a\x00", False),
        ("a\x7f", False),
    ],
)
def test_check_key(key: str, ok: bool) -> None:
    if ok:
        assert keys.check_key(key) == key
    else:
        with pytest.raises(InvalidKeyError):
            keys.check_key(key)


def test_nasty_topics_stay_inside_their_directory_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root, fsync=False)
    written = []
    for i, name in enumerate(NASTY):
        topic = TopicName("persistent", name, name, name)
        key = keys.data_key("offload", topic, uuid.UUID(int=i))
        store.put(key, name.encode("utf-8", "surrogatepass"))
        file = (root / key).resolve()
        assert file.is_file()
        assert file.parent == (root / keys.topic_dir("offload", topic)).resolve()
        assert root.resolve() in file.parents
        written.append(topic)
    found = keys.list_topic_dirs(ScopedStore(store, "offload"))
    assert found == sorted(written)
    for topic in written:
        assert [i.key for i in store.list(keys.topic_dir("offload", topic))] == [
            keys.data_key("offload", topic, uuid.UUID(int=NASTY.index(topic.local_name)))
        ]


def test_list_topic_dirs_ignores_foreign_keys(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    topic = TopicName.parse("persistent://t/n/x-partition-1")
    store.put(keys.manifest_key("p", topic, 1, 0, UUID), b"m")
    store.put(keys.data_key("p", topic, UUID), b"d")
    store.put("p/README", b"not a topic")
    store.put("p/a/b/c.d/obj", b"raw '.' is never produced by the encoding")
    store.put("elsewhere/t/n/y/obj", b"other prefix")
    assert keys.list_topic_dirs(ScopedStore(store, "p")) == [topic]
    # Without the prefix, the first three components of every deep enough key are taken as a topic.
    assert [str(t) for t in keys.list_topic_dirs(ScopedStore(store))] == [
        "persistent://elsewhere/t/n",
        "persistent://p/a/b",
        "persistent://p/t/n",
    ]
