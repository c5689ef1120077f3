"""S3-only behaviour: the 5 MiB part minimum, retries, the shared client, credentials hygiene, key prefixes."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from streamoffload.redaction import RedactingFilter
from streamoffload.storage import s3 as s3_module
from streamoffload.storage import s3_runtime
from streamoffload.storage.base import (
    ObjectExistsError,
    ObjectNotFoundError,
    PartTooSmallError,
    StorageError,
    UploadNotFoundError,
)
from streamoffload.storage.s3 import MIN_PART_SIZE, S3Store
from streamoffload.storage.s3_errors import UnsupportedOperationError
from tests.fixtures.s3 import free_port

pytestmark = pytest.mark.s3

SECRET_ID = "AKIAEXAMPLESECRETID7"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRET"
SECRET_TOKEN = "FwoGZXIvYXdzEXAMPLETOKENzzSECRET"


def test_small_non_last_part_fails_at_complete_and_the_upload_can_be_repaired(s3_store: S3Store) -> None:
    assert s3_store.min_part_size == MIN_PART_SIZE == 5 * 1024 * 1024
    write = s3_store.start_multipart("seg/data")
    write.write_part(1, b"a" * 1024)
    write.write_part(2, b"b" * 10)
    with pytest.raises(PartTooSmallError) as err:
        write.complete([1, 2])
    message = str(err.value)
    assert "at least 5242880 bytes (5 MiB)" in message
    assert "part 1 (1024 bytes)" in message
    assert "seg/data" in message
    assert not s3_store.exists("seg/data")
    # Not silently aborted: the caller may rewrite the part and complete again.
    assert [p.upload_id for p in s3_store.pending_multiparts("seg/")] == [write.upload_id]
    big = b"A" * (MIN_PART_SIZE + 1)
    write.write_part(1, big)
    assert write.complete([1, 2]).size == len(big) + 10
    assert s3_store.get_range("seg/data", MIN_PART_SIZE - 1, 4) == b"AAbb"


def test_store_prefix_is_prepended_and_stripped(s3_bucket: str, s3_settings: dict[str, Any], s3_client: Any) -> None:
    deep = S3Store(s3_bucket, "/a/b/", **s3_settings)
    assert deep.url == f"s3://{s3_bucket}/a/b"
    deep.put("k/1", b"x")
    deep.start_multipart("k/2").write_part(1, b"y")
    raw = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert raw == ["a/b/k/1"]
    assert [i.key for i in deep.list("")] == ["k/1"]
    assert [p.key for p in deep.pending_multiparts("")] == ["k/2"]
    shallow = S3Store(s3_bucket, "a", **s3_settings)
    assert [i.key for i in shallow.list("b/")] == ["b/k/1"]
    assert shallow.get("b/k/1") == b"x"
    whole = S3Store(s3_bucket, **s3_settings)
    assert whole.url == f"s3://{s3_bucket}"
    assert [i.key for i in whole.list("")] == ["a/b/k/1"]


def test_missing_bucket_is_named(s3_settings: dict[str, Any]) -> None:
    store = S3Store("no-such-bucket-here", **s3_settings)
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist"):
        store.get("k")
    with pytest.raises(StorageError, match="does not exist"):
        list(store.list(""))


def test_stores_of_one_configuration_share_one_client(s3_bucket: str, s3_settings: dict[str, Any]) -> None:
    first, second = S3Store(s3_bucket, "x", **s3_settings), S3Store(s3_bucket, "y", **s3_settings)
    first.put("k", b"1")
    second.put("k", b"2")
    runtime = s3_runtime.get_runtime()
    assert runtime.clients[first._cfg] is runtime.clients[second._cfg]
    first.close()  # closing one store leaves the shared client to the others
    assert second.get("k") == b"2"
    with pytest.raises(StorageError, match="closed"):
        first.get("k")


def test_concurrent_use_from_many_threads(s3_store: S3Store) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(5):
                key = f"w{worker}/{i}"
                s3_store.put(key, f"{worker}:{i}".encode())
                assert s3_store.get(key) == f"{worker}:{i}".encode()
                assert s3_store.get_range(key, 0, 1) == str(worker).encode()[:1]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(list(s3_store.list(""))) == 40


def _get_in_child(store: S3Store, key: str, queue: Any) -> None:
    try:
        queue.put(store.get(key))
    except BaseException as exc:
        queue.put(repr(exc))


def test_store_works_in_a_forked_child(s3_store: S3Store) -> None:
    s3_store.put("forked", b"from the parent")  # the parent's loop and client exist before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_get_in_child, args=(s3_store, "forked", queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(60)
    assert result == b"from the parent"
    assert child.exitcode == 0
    assert s3_store.get("forked") == b"from the parent"  # the parent's client is unharmed


# --- retries against a scripted server -----------------------------------------------------------------


class ScriptedS3:
    """An HTTP server that answers from a script of (status, code, body) and counts requests."""

    def __init__(self, script: list[tuple[int, str, bytes]]) -> None:
        self.script = script
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # so that it answers botocore's "Expect: 100-continue"

            def _answer(self) -> None:
                outer.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                index = min(len(outer.requests), len(outer.script)) - 1
                status, code, body = outer.script[index]
                if code:
                    body = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                        f"<Message>{body.decode()}</Message></Error>"
                    ).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/xml" if code else "application/octet-stream")
                self.send_header("ETag", '"5d41402abc4b2a76b9719d911017c592"')
                self.send_header("Last-Modified", "Wed, 01 Jan 2025 00:00:00 GMT")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[ScriptedS3] = []

    def start(script: list[tuple[int, str, bytes]]) -> ScriptedS3:
        servers.append(ScriptedS3(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _store(endpoint: str, **extra: Any) -> S3Store:
    options: dict[str, Any] = {
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "path_style": True,
        "access_key": SECRET_ID,
        "secret_key": SECRET_KEY,
        "session_token": SECRET_TOKEN,
        "max_attempts": 4,
        "retry_base_delay": 0.001,
        "retry_max_delay": 0.01,
        "connect_timeout": 2,
        "read_timeout": 5,
    }
    options.update(extra)
    return S3Store("bucket", "pfx", **options)


def test_throttling_is_retried_until_it_passes(scripted: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = scripted(
        [
            (503, "SlowDown", b"Please reduce your request rate."),
            (500, "InternalError", b"We encountered an internal error."),
            (200, "", b"hello"),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="streamoffload.storage.s3"):
        assert _store(server.url).get("k") == b"hello"
    assert server.requests == ["GET /bucket/pfx/k"] * 3
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) == 2
    assert "SlowDown" in retries[0]
    assert "attempt 1 of 4" in retries[0]


class Backoffs:
    """Stands in for ``storage.s3``'s ``random``: records the range of each backoff it draws (the full-jitter
    bound, ``min(max_delay, base * 2 ** (attempt - 1))``) and waits all of it, so the waits are known exactly."""

    def __init__(self) -> None:
        self.bounds: list[float] = []

    def uniform(self, low: float, high: float) -> float:
        assert low == 0
        self.bounds.append(high)
        return high


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> Backoffs:
    drawn = Backoffs()
    monkeypatch.setattr(s3_module, "random", drawn)
    return drawn


def test_persistent_5xx_gives_up_after_max_attempts(scripted: Any, backoffs: Backoffs) -> None:
    server = scripted([(503, "ServiceUnavailable", b"Reduce your request rate.")])
    with pytest.raises(StorageError) as err:
        _store(server.url, retry_base_delay=0.004).put("k", b"x")
    # Three waits between four attempts, doubling from the base and capped at retry_max_delay (0.01 s).
    assert backoffs.bounds == [0.004, 0.008, 0.01]
    assert server.requests == ["PUT /bucket/pfx/k"] * 4
    message = str(err.value)
    assert "after 4 attempts" in message
    assert "ServiceUnavailable" in message
    assert "s3://bucket/pfx" in message
    assert "'k'" in message


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (404, "NoSuchKey", ObjectNotFoundError),
        (403, "AccessDenied", StorageError),
        (400, "InvalidArgument", StorageError),
    ],
)
def test_client_errors_are_not_retried(scripted: Any, status: int, code: str, expected: type[Exception]) -> None:
    server = scripted([(status, code, b"no")])
    with pytest.raises(expected) as err:
        _store(server.url).get("some/key")
    assert len(server.requests) == 1
    assert "some/key" in str(err.value)
    if expected is StorageError:
        assert code in str(err.value)


def test_unreachable_endpoint_fails_fast_with_bounded_attempts(
    caplog: pytest.LogCaptureFixture, backoffs: Backoffs
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    store = _store(endpoint, max_attempts=3)
    with caplog.at_level(logging.WARNING, logger="streamoffload.storage.s3"), pytest.raises(StorageError) as err:
        store.head("k")
    assert backoffs.bounds == [0.001, 0.002], "two backoffs of the configured bounds between three attempts"
    # Refused at once each time (a connect that hung would end in ConnectTimeoutError after connect_timeout).
    assert str(err.value) == (
        f"s3://bucket/pfx: S3 head 'k' failed after 3 attempts at {endpoint}: EndpointConnectionError: "
        f'Could not connect to the endpoint URL: "{endpoint}/bucket/pfx/k"'
    )
    assert len(caplog.records) == 2  # one warning per retry


def test_credentials_never_appear_in_repr_errors_or_logs(scripted: Any, caplog: pytest.LogCaptureFixture) -> None:
    # A server that (like some S3 implementations) echoes the access key id in its error messages.
    server = scripted(
        [(500, "InternalError", f"key {SECRET_ID} failed".encode()), (403, "InvalidAccessKeyId", SECRET_ID.encode())]
    )
    store = _store(server.url)
    texts = [repr(store), str(store), store.url, repr(store._cfg)]
    # The filter every handler of ours has (cli_common.configure_logging), on the handler that keeps the records
    # of ALL loggers: botocore's and aiobotocore's at DEBUG log the signed request headers and the response body.
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(StorageError) as err:
            store.get("k")
        texts += [str(err.value), repr(err.value), "".join(traceback.format_exception(err.value))]
        unreachable = _store(f"http://127.0.0.1:{free_port()}", max_attempts=2)
        with pytest.raises(StorageError) as err2:
            unreachable.put("k", b"x")
        texts += [str(err2.value), repr(err2.value), repr(unreachable)]
    texts += [caplog.text]
    assert {"botocore.endpoint", "botocore.parsers"} <= {record.name for record in caplog.records}
    assert "'Authorization': b'***'" in caplog.text  # the header was logged, masked
    assert "InvalidAccessKeyId" in str(err.value)
    for text in texts:
        for secret in (SECRET_ID, SECRET_KEY, SECRET_TOKEN):
            assert secret not in text, text


def test_configuration_errors() -> None:
    from streamoffload.errors import ConfigError

    with pytest.raises(ConfigError, match="both access_key and secret_key"):
        S3Store("b", access_key="only-the-id")
    with pytest.raises(ConfigError, match="bucket"):
        S3Store("")
    with pytest.raises(ConfigError, match="max_attempts"):
        S3Store("b", max_attempts=0)


@pytest.mark.parametrize(("body", "created"), [(b"hello", True), (b"other", False)])
def test_if_absent_retry_recognises_its_own_earlier_write(scripted: Any, body: bytes, created: bool) -> None:
    # Attempt 1 fails (the object may or may not have been written); attempt 2 finds the key taken.
    # The store then looks: an object with our bytes (ETag = MD5 of "hello") is our own earlier write.
    server = scripted([(500, "InternalError", b"oops"), (412, "PreconditionFailed", b"exists"), (200, "", b"")])
    store = _store(server.url)
    if created:
        assert store.put("k", body, if_absent=True).size == len(body)
    else:
        with pytest.raises(ObjectExistsError):
            store.put("k", body, if_absent=True)
    assert [r.split()[0] for r in server.requests] == ["PUT", "PUT", "HEAD"]


# --- APIs an endpoint lacks, and conflicts worth retrying ------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "operation"),
    [(501, "NotImplemented", "GetObject"), (405, "MethodNotAllowed", "GetObject"), (501, "", "GetObject")],
)
def test_an_api_the_endpoint_lacks_is_not_retried_and_is_named(
    scripted: Any, caplog: pytest.LogCaptureFixture, status: int, code: str, operation: str
) -> None:
    server = scripted([(status, code, b"A parameter you provided implies functionality that is not implemented.")])
    with caplog.at_level(logging.WARNING, logger="streamoffload.storage.s3"), pytest.raises(StorageError) as err:
        _store(server.url).get("some/key")
    assert len(server.requests) == 1
    assert caplog.records == []  # no "retrying" warnings either
    assert isinstance(err.value, UnsupportedOperationError)
    assert err.value.operation == operation
    message = str(err.value)
    assert message.startswith(f"s3://bucket/pfx: the S3 endpoint at {server.url} does not implement GetObject, ")
    assert "needed for get 'some/key'" in message
    assert "not retried" in message


def test_conditional_request_conflict_is_retried(scripted: Any) -> None:
    # AWS answers 409 ConditionalRequestConflict when conditional writes on one key race; a retry settles it.
    server = scripted(
        [(409, "ConditionalRequestConflict", b"A conflicting conditional operation is in progress."), (200, "", b"")]
    )
    assert _store(server.url).put("k", b"hello", if_absent=True).size == 5
    assert [r.split()[0] for r in server.requests] == ["PUT", "PUT"]


def test_other_409s_are_not_retried(scripted: Any) -> None:
    server = scripted([(409, "OperationAborted", b"A conflicting operation is in progress.")])
    with pytest.raises(StorageError, match="OperationAborted"):
        _store(server.url).put("k", b"hello")
    assert len(server.requests) == 1


_LIST_PARTS = (
    b"<?xml version='1.0' encoding='UTF-8'?><ListPartsResult><Bucket>bucket</Bucket><Key>pfx/mp</Key>"
    b"<UploadId>u-1</UploadId><IsTruncated>false</IsTruncated></ListPartsResult>"
)


def test_resume_falls_back_to_list_parts_where_list_multipart_uploads_is_missing(scripted: Any) -> None:
    server = scripted(
        [
            (501, "NotImplemented", b"not implemented"),
            (200, "", _LIST_PARTS),
            (200, "", _LIST_PARTS),
            (404, "NoSuchUpload", b"The specified upload does not exist."),
        ]
    )
    store = _store(server.url)
    assert store.resume_multipart("mp", "u-1").upload_id == "u-1"
    assert store.resume_multipart("mp", "u-1").upload_id == "u-1"  # ListMultipartUploads is not asked again
    with pytest.raises(UploadNotFoundError):
        store.resume_multipart("mp", "gone")
    assert server.requests == [
        "GET /bucket?uploads&prefix=pfx%2Fmp",
        "GET /bucket/pfx/mp?uploadId=u-1&max-parts=1",
        "GET /bucket/pfx/mp?uploadId=u-1&max-parts=1",
        "GET /bucket/pfx/mp?uploadId=gone&max-parts=1",
    ]


def test_s3rver_list_multipart_uploads_is_not_retried(s3rver_store: S3Store, caplog: pytest.LogCaptureFixture) -> None:
    # s3rver answers ListMultipartUploads with 501: one request, an error naming it, no five retries.
    with caplog.at_level(logging.WARNING, logger="streamoffload.storage.s3"), pytest.raises(StorageError) as err:
        list(s3rver_store.pending_multiparts("t/"))
    assert caplog.records == []  # no retry was logged: the one answer was taken as final
    message = str(err.value)
    assert message.startswith(f"{s3rver_store.url}: the S3 endpoint at {s3rver_store.endpoint_url} does not ")
    assert "does not implement ListMultipartUploads, needed for pending_multiparts 't/'" in message
    assert "NotImplemented (HTTP 501)" in message
