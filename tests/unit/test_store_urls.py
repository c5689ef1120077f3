"""One store-URL parser (``storage.urls.parse_store_url``) for every way a URL comes in: ``open_store``, the
command line's ``--store``, and the offloaded-read source's ``store`` option refuse the same URLs with the same
message. And the minimum part size the job gives the segmenter is the store class's, known from the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.cli import main
from streamoffload.cli_common import store_settings_from_url
from streamoffload.config import StoreSettings
from streamoffload.errors import ConfigError
from streamoffload.read.dataset_plan import StoreLocation
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.s3 import S3Store
from streamoffload.storage.urls import open_store
from streamoffload.streaming.job.queries import min_part_size
from tests.unit.test_cli_errors import one_error_line

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
        StoreLocation(url).open()
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
        assert open_store(url, fsync=False).url == settings.url


def test_the_jobs_minimum_part_is_the_store_classes_and_opens_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not-created"
    filesystem = StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(missing))
    assert min_part_size(filesystem) == FilesystemStore.min_part_size == 1
    assert not missing.exists()  # resolved from the URL's scheme: no store was opened
    for driver in ("s3", "aws-s3"):
        s3 = StoreSettings(managedLedgerOffloadDriver=driver, bucket="no-such-bucket", prefix="p")
        assert min_part_size(s3) == S3Store.min_part_size == 5 * 1024 * 1024
