"""One store-URL parser (``storage.location.parse_store_url``) for every way a URL comes in: ``open_store``, the
command line's ``--store``, and the offloaded-read source's ``store`` option refuse the same URLs with the same
message. One ``StoreLocation`` for where the store is, from a URL or the configuration: it opens the same store,
scoped to the same key prefix, as the configuration always did, and pickles. And the minimum part size the job
gives the segmenter is the store class's, known from the location without opening anything."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from streamoffload.cli import main
from streamoffload.cli_common import store_settings_from_url
from streamoffload.config import StoreSettings
from streamoffload.errors import ConfigError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore, StoreNotFoundError, open_store, parse_store_url
from streamoffload.storage.s3 import S3Store
from streamoffload.streaming.source.offloaded_source import OffloadedOptions
from tests.commands.test_cli_errors import one_error_line

BAD_URLS = [
    "ftp://host/x",
    "file://otherhost/x",
    "file:///tmp/x?y=1",
    "file://localhost",
    "s3:///prefix",
    "s3://bucket/p?versionId=1",
    "s3://bucket#frag",
    "s3://AKIDSECRET:hunter2@bucket/prefix",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_every_entry_point_refuses_a_bad_url_with_the_same_message(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as via_open_store:
        open_store(url)
    message = str(via_open_store.value)
    assert message.startswith("store URL")
    assert "hunter2" not in message and "AKIDSECRET" not in message

    with pytest.raises(ConfigError) as via_settings:
        store_settings_from_url(url, endpoint="http://127.0.0.1:1")
    assert str(via_settings.value) == message

    with pytest.raises(ConfigError) as via_offloaded_read:
        OffloadedOptions.parse({"store": url, "topics": "persistent://a/b/c"})
    assert str(via_offloaded_read.value) == message

    assert main(["status", "--store", url]) == 1
    assert one_error_line(capsys.readouterr().err, "status") == f"streamoffload status: error: {message}"


@pytest.mark.parametrize(
    ("url", "driver", "where"),
    [
        ("s3://bucket/a/b/", "s3", ("bucket", "a/b")),
        ("s3://bucket", "s3", ("bucket", "")),
    ],
)
def test_the_cli_configures_what_open_store_opens(url: str, driver: str, where: tuple[str, str]) -> None:
    settings = store_settings_from_url(url, endpoint="http://127.0.0.1:1", region="us-east-1")
    assert (settings.managedLedgerOffloadDriver, settings.bucket, settings.prefix) == (driver, *where)
    opened = open_store(url, endpoint_url="http://127.0.0.1:1")
    assert isinstance(opened, S3Store) and (opened.bucket, opened.prefix.strip("/")) == where
    assert store_settings_from_url(url).managedLedgerOffloadDriver == "aws-s3"  # no endpoint: AWS itself


def test_the_cli_resolves_a_filesystem_url_to_the_directory_open_store_opens(tmp_path: Path) -> None:
    target = tmp_path / "dir with space"
    for url in (target.as_uri(), str(target)):
        settings = store_settings_from_url(url)
        assert settings.managedLedgerOffloadDriver == "filesystem"
        assert Path(settings.root) == target.resolve()
        assert open_store(url, fsync=False).url == settings.location.open().store.url


def test_the_jobs_minimum_part_is_the_store_classes_and_opens_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not-created"
    filesystem = StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(missing))
    assert filesystem.location.min_part_size == FilesystemStore.min_part_size == 1
    # What the segmenter gathers into a part: small segments are written whole at their seal (DESIGN, step 1).
    assert filesystem.location.part_size == FilesystemStore.part_size == 256 * 1024
    assert not missing.exists()  # known from the location's scheme: no store was opened
    for driver in ("s3", "aws-s3"):
        s3 = StoreSettings(managedLedgerOffloadDriver=driver, bucket="no-such-bucket", prefix="p")
        assert s3.location.min_part_size == S3Store.min_part_size == 5 * 1024 * 1024
        assert s3.location.part_size == S3Store.part_size == S3Store.min_part_size


def test_a_location_from_a_url_equals_the_one_from_the_settings_the_cli_makes(tmp_path: Path) -> None:
    for url, endpoint in (("s3://bucket/a/b/", "http://127.0.0.1:1"), ("s3://bucket", None)):
        settings = store_settings_from_url(url, endpoint=endpoint, region="eu-1")
        assert settings.location == parse_store_url(url, endpoint=endpoint, region="eu-1")
    settings = store_settings_from_url(str(tmp_path))
    assert settings.location == replace(parse_store_url(str(tmp_path)), path=str(tmp_path.resolve()), file_mode=0o600)


def test_an_s3_location_opens_the_buckets_root_scoped_to_its_prefix() -> None:
    """Keys (and the data keys manifests record) stay relative to the bucket, prefix included, as they always
    were: the store is opened at the bucket's root, and the prefix travels beside it."""
    location = parse_store_url("s3://bucket/a/b/", endpoint="http://127.0.0.1:1")
    assert (location.bucket, location.prefix, location.path_style) == ("bucket", "a/b", True)
    scoped = location.open()
    assert isinstance(scoped.store, S3Store) and scoped.store.bucket == "bucket" and scoped.store.prefix == ""
    assert scoped.prefix == "a/b"
    assert scoped.describe() == f"{scoped.store.url} under prefix 'a/b'"
    assert location.describe() == "s3://bucket/a/b"


def test_a_filesystem_location_has_no_key_prefix_and_keeps_its_modes(tmp_path: Path) -> None:
    settings = StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(tmp_path / "s"), prefix="ignored")
    location = settings.location
    assert (location.prefix, location.file_mode, location.dir_mode) == ("", 0o600, None)
    scoped = location.open()
    assert scoped.prefix == "" and isinstance(scoped.store, FilesystemStore)
    assert scoped.store.url == (tmp_path / "s").resolve().as_uri() == location.describe()


def test_open_without_create_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        parse_store_url(str(tmp_path / "nowhere")).open(create=False)
    assert not (tmp_path / "nowhere").exists()


def test_a_location_pickles_and_a_scoped_store_strips_its_prefix(tmp_path: Path) -> None:
    location = parse_store_url("s3://bucket/p", endpoint="http://127.0.0.1:1", region="eu-1")
    assert pickle.loads(pickle.dumps(location)) == location
    assert hash(location) == hash(pickle.loads(pickle.dumps(location)))  # the sink's per-process cache key
    assert ScopedStore(FilesystemStore(tmp_path), "/a/b/").prefix == "a/b"
