"""``check_store``: the start-up probe of what the job relies on, on the filesystem store, moto and s3rver
(which ignores If-None-Match and lacks parts of the multipart API), and ``streamoffload run`` refusing s3rver."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from streamoffload.storage.base import MultipartWrite, ObjectInfo, StorageError, TransientStorageError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.storage.probe import (
    CONDITIONAL_CREATE,
    LISTING,
    MULTIPART,
    MULTIPART_ABORT,
    RANGED_GET,
    STRAY_UPLOAD_LISTING,
    WHOLE_OBJECTS,
    StoreCapabilityError,
    check_store,
)
from streamoffload.storage.request_counts import CountingStore, RequestCounts
from streamoffload.storage.s3 import S3Store
from tests.fixtures.s3rver import S3RVER_CREDENTIALS

REPO = Path(__file__).resolve().parents[2]


class RecordingStore(FilesystemStore):
    """A real filesystem store that remembers every key written to it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.written: list[str] = []

    def put(
        self, key: str, data: bytes | memoryview, metadata: Mapping[str, str] | None = None, *, if_absent: bool = False
    ) -> ObjectInfo:
        self.written.append(key)
        return super().put(key, data, metadata, if_absent=if_absent)

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        self.written.append(key)
        return super().start_multipart(key, metadata)


def test_probe_passes_on_the_filesystem_store_and_leaves_nothing_behind(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.put("tenant/ns/topic/existing", b"kept")
    report = check_store(ScopedStore(store, "/deploy/prod/"))
    assert report.url == tmp_path.as_uri()
    assert report.stray_upload_listing is True
    assert report.notes == ()
    probe_keys = store.written[1:]
    assert len(probe_keys) >= 4
    prefixes = {key.rsplit("/", 1)[0] for key in probe_keys}
    assert len(prefixes) == 1
    (prefix,) = prefixes
    assert prefix.startswith("deploy/prod/_meta/probe/") and len(prefix.rsplit("/", 1)[1]) == 32
    assert [info.key for info in store.list("")] == ["tenant/ns/topic/existing"]
    assert list(store.pending_multiparts("")) == []
    # A second probe picks another random directory: two jobs starting at once do not collide.
    check_store(ScopedStore(store, "deploy/prod"))
    assert {key.rsplit("/", 1)[0] for key in store.written[len(probe_keys) + 1 :]} != prefixes


def test_a_disk_that_fills_during_the_probe_is_a_store_error_to_retry_not_a_missing_capability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 100-fault chaos run (session 30) saw the job exit for good: the disk filled while its start-up probe
    made the create-only PUT, and the ENOSPC was reported as a store lacking If-None-Match, which ``run`` does
    not retry. The full disk comes from the filesystem store's own test flag, set as the create-only PUT
    starts: the store's real error path."""
    flag = tmp_path / "disk-full"
    monkeypatch.setenv("STREAMOFFLOAD_TEST_DISK_FULL_FLAG", str(flag))

    class FillingStore(FilesystemStore):
        def put(
            self,
            key: str,
            data: bytes | memoryview,
            metadata: Mapping[str, str] | None = None,
            *,
            if_absent: bool = False,
        ) -> ObjectInfo:
            if if_absent:
                flag.touch()
            return super().put(key, data, metadata, if_absent=if_absent)

    with pytest.raises(TransientStorageError, match="No space left on device") as raised:
        check_store(ScopedStore(FillingStore(tmp_path / "store")))
    assert not isinstance(raised.value, StoreCapabilityError)
    flag.unlink()
    assert check_store(ScopedStore(FilesystemStore(tmp_path / "store"))).notes == ()  # space back: it passes


@pytest.mark.s3
def test_probe_passes_on_moto_in_a_few_requests_and_cleans_up(
    s3_bucket: str, s3_settings: dict[str, Any], s3_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    counts = RequestCounts()
    store = CountingStore(S3Store(s3_bucket, **s3_settings), counts)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="streamoffload.storage.s3"):
        report = check_store(ScopedStore(store, "deploy/prod"))
    elapsed = time.monotonic() - started
    assert report.url == f"s3://{s3_bucket} (endpoint {s3_settings['endpoint_url']})"
    assert report.stray_upload_listing is True
    assert report.notes == ()
    assert 0 < report.elapsed <= elapsed
    # What a start-up pays, exactly: these requests, none retried (no backoff waited), nothing waited for. How
    # long they take is a bench's figure, not a bound here.
    assert counts.snapshot() == {
        "put": 3,
        "head": 1,
        "get": 2,
        "get_range": 2,
        "start_multipart": 2,
        "write_part": 4,
        "resume_multipart": 2,
        "complete": 1,
        "pending_multiparts": 1,
        "abort": 1,
        "list": 2,
        "delete": 4,
    }
    assert [r.getMessage() for r in caplog.records] == [], "no request was retried"
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    assert not s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads")


@pytest.mark.s3
def test_probe_refuses_s3rver_naming_if_none_match(s3rver_store: S3Store, s3rver_server: str) -> None:
    with pytest.raises(StoreCapabilityError) as err:
        check_store(ScopedStore(s3rver_store, "deploy"))
    message = str(err.value)
    assert isinstance(err.value, StorageError)
    assert message.startswith(
        f"{s3rver_store.url} (endpoint {s3rver_server}) ignores If-None-Match (conditional create): a second "
        "create-only PUT overwrote the object; streamoffload needs it for fencing and exactly-once commits."
    ), message
    assert message.endswith(
        "Use AWS S3, MinIO, or another store that supports conditional writes and implements the S3 operations "
        "streamoffload uses."
    ), message
    # What else s3rver lacks is named too, so one run tells the whole story.
    assert err.value.missing == (CONDITIONAL_CREATE, MULTIPART, MULTIPART_ABORT)
    assert "does not implement ListParts" in message
    assert "does not implement AbortMultipartUpload" in message
    assert "\n" not in message
    assert list(s3rver_store.list("")) == []  # the probe objects were deleted


class IgnoresIfNoneMatch(FilesystemStore):
    def put(
        self, key: str, data: bytes | memoryview, metadata: Mapping[str, str] | None = None, *, if_absent: bool = False
    ) -> ObjectInfo:
        return super().put(key, data, metadata)


class IgnoresRanges(FilesystemStore):
    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.get(key)


class ListsInWriteOrder(FilesystemStore):
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter(sorted(super().list(prefix), key=lambda info: info.last_modified))


class AbortDoesNothing(FilesystemStore):
    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        write = super().start_multipart(key, metadata)
        write.abort = lambda: None  # type: ignore[method-assign]
        return write


class ForgetsMetadata(FilesystemStore):
    def put(
        self, key: str, data: bytes | memoryview, metadata: Mapping[str, str] | None = None, *, if_absent: bool = False
    ) -> ObjectInfo:
        return super().put(key, data, None, if_absent=if_absent)


class CannotResume(FilesystemStore):
    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        raise StorageError(f"{self.url}: resume_multipart is not available here")


@pytest.mark.parametrize(
    ("store_class", "capability", "said"),
    [
        (IgnoresIfNoneMatch, CONDITIONAL_CREATE, "ignores If-None-Match (conditional create)"),
        (IgnoresRanges, RANGED_GET, "for bytes [6, 13) of an object, not b'offload'"),  # multipart seam too
        (ListsInWriteOrder, LISTING, "(in key order)"),
        (AbortDoesNothing, MULTIPART_ABORT, "after aborting it"),
        (ForgetsMetadata, WHOLE_OBJECTS, "does not keep user metadata"),
        (CannotResume, MULTIPART, "fails a multipart upload: resume_multipart is not available here"),
    ],
)
def test_each_missing_capability_is_named(
    tmp_path: Path, store_class: type[FilesystemStore], capability: str, said: str
) -> None:
    store = store_class(tmp_path)
    with pytest.raises(StoreCapabilityError) as err:
        check_store(ScopedStore(store))
    assert err.value.missing == ((capability, MULTIPART) if store_class is IgnoresRanges else (capability,))
    message = str(err.value)
    assert message.startswith(f"{tmp_path.as_uri()} ")
    assert said in message
    assert "streamoffload needs it" in message


def test_the_if_none_match_message_in_full(tmp_path: Path) -> None:
    with pytest.raises(StoreCapabilityError) as err:
        check_store(ScopedStore(IgnoresIfNoneMatch(tmp_path), "p"))
    assert str(err.value) == (
        f"{tmp_path.as_uri()} ignores If-None-Match (conditional create): a second create-only PUT overwrote the "
        "object; streamoffload needs it for fencing and exactly-once commits. Use AWS S3, MinIO, or another store "
        "that supports conditional writes."
    )
    assert list(FilesystemStore(tmp_path).list("")) == []


class NoUploadListing(FilesystemStore):
    def pending_multiparts(self, prefix: str) -> Iterator[Any]:
        raise StorageError(f"{self.url}: the endpoint does not implement ListMultipartUploads")


def test_missing_upload_listing_is_reported_not_fatal(tmp_path: Path) -> None:
    report = check_store(ScopedStore(NoUploadListing(tmp_path)))
    assert report.stray_upload_listing is False
    assert [note.capability for note in report.notes] == [STRAY_UPLOAD_LISTING]
    assert "does not implement ListMultipartUploads" in report.notes[0].detail
    assert list(FilesystemStore(tmp_path).pending_multiparts("")) == []  # the aborted upload is gone all the same


def test_a_store_that_cannot_write_at_all_fails_with_its_own_error(tmp_path: Path) -> None:
    (tmp_path / "_meta").write_bytes(b"a file where the probe needs a directory")
    with pytest.raises(StorageError) as err:
        check_store(ScopedStore(FilesystemStore(tmp_path)))
    assert not isinstance(err.value, StoreCapabilityError)


@pytest.mark.s3
def test_run_refuses_s3rver_in_one_line_before_spark_starts(
    s3rver_bucket: str, s3rver_server: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": S3RVER_CREDENTIALS["access_key"],
        "AWS_SECRET_ACCESS_KEY": S3RVER_CREDENTIALS["secret_key"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "STREAMOFFLOAD_CRASH_AT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "streamoffload",
        "run",
        "--once",
        "--store",
        f"s3://{s3rver_bucket}/offload",
        "--s3-endpoint",
        s3rver_server,
        "--service-url",
        "pulsar://127.0.0.1:1",
        "--topics",
        "persistent://public/default/probe",
        "--checkpoint",
        str(tmp_path / "checkpoint"),
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"streamoffload run: error: s3://{s3rver_bucket} (endpoint {s3rver_server}) ignores ")
    assert "If-None-Match" in lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "checkpoint").exists()
    assert elapsed < 60
