"""The S3 object store (AWS S3 and S3-compatible endpoints) through aiobotocore.

The core is async; ``S3Store`` is a thin synchronous wrapper because its callers (Spark tasks, the CLI,
read-ahead threads) are synchronous. It calls through the process-wide loop thread and shared clients of
``storage.s3_runtime``.

Retries are ours, not botocore's, so they are the same for every call and tunable: up to
``max_attempts`` tries with full-jitter exponential backoff on what ``storage.s3_errors`` deems retryable
(throttling, 5xx, timeouts, connection errors, 409 ConditionalRequestConflict). An answer that says the API
does not exist on this endpoint (501 NotImplemented, 405 MethodNotAllowed) is never retried: it raises
``UnsupportedOperationError`` at once, naming the S3 operation and the store (``storage.probe.check_store``
finds those at start). Credentials come from the arguments or the standard AWS chain; they are never logged,
never in ``repr`` and scrubbed from error messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import botocore.exceptions

from streamoffload.errors import ConfigError
from streamoffload.redaction import redact, register_secret
from streamoffload.storage.base import (
    Buffer,
    MultipartWrite,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    PartData,
    PartTooSmallError,
    PendingUpload,
    StorageError,
    TransientStorageError,
    UploadNotFoundError,
    check_part_list,
    check_part_number,
    normalize_metadata,
    part_buffers,
)
from streamoffload.storage.keys import check_key, check_prefix
from streamoffload.storage.s3_errors import (
    NOT_FOUND_CODES,
    AttemptTimeout,
    UnsupportedOperationError,
    describe_error,
    error_code,
    is_retryable,
    is_unsupported,
)
from streamoffload.storage.s3_runtime import ClientConfig, get_runtime

log = logging.getLogger(__name__)

T = TypeVar("T")

MIN_PART_SIZE = 5 * 1024 * 1024

_MIN_UPLOAD_RATE = 512 * 1024
"""Bytes per second below which an upload attempt is given up (and retried)."""


# --- the store -----------------------------------------------------------------------------------------


class S3Store(ObjectStore):
    """Objects in ``bucket`` under ``prefix`` (prepended to every key, stripped from results)."""

    min_part_size = MIN_PART_SIZE
    part_size = MIN_PART_SIZE

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = False,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        profile: str | None = None,
        max_attempts: int = 5,
        retry_base_delay: float = 0.2,
        retry_max_delay: float = 10.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_pool_connections: int = 32,
        checksums: str = "when_supported",
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigError(f"S3 bucket name {bucket!r} is empty or contains '/'")
        if (access_key is None) != (secret_key is None):
            raise ConfigError("S3 credentials: give both access_key and secret_key, or neither (AWS chain)")
        if max_attempts < 1:
            raise ConfigError(f"S3 max_attempts must be >= 1, got {max_attempts}")
        if checksums not in ("when_supported", "when_required"):
            raise ConfigError(f"S3 checksums must be 'when_supported' or 'when_required', got {checksums!r}")
        norm = prefix.strip("/")
        if norm:
            check_key(norm)
        self._bucket = bucket
        self._prefix = norm + "/" if norm else ""
        self._url = f"s3://{bucket}/{norm}" if norm else f"s3://{bucket}"
        self._endpoint_url = endpoint_url
        self._max_attempts = max_attempts
        self._base_delay = retry_base_delay
        self._max_delay = retry_max_delay
        self._secrets = tuple(s for s in (access_key, secret_key, session_token) if s)
        register_secret(*self._secrets)  # masked in every log line too (a server may echo the key id)
        self._cfg = ClientConfig(
            endpoint_url=endpoint_url,
            region=region,
            path_style=path_style,
            profile=profile,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            checksums=checksums,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
        )
        self._closed = False
        self._no_list_uploads = False
        """Set once the endpoint answered ListMultipartUploads with "not implemented" (``resume_multipart``
        then checks upload ids with ListParts)."""

    # --- plumbing ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def endpoint_url(self) -> str | None:
        """The S3-compatible endpoint, or None for AWS S3 itself."""
        return self._endpoint_url

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket, ``""`` or ending with ``/``."""
        return self._prefix

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={redact(self._endpoint_url)!r}" if self._endpoint_url else ""
        return f"S3Store({self._url!r}{endpoint})"

    def close(self) -> None:
        # The client is shared by every store of this configuration in the process; it is closed at exit.
        self._closed = True

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _strip(self, full_key: str) -> str:
        return full_key[len(self._prefix) :] if full_key.startswith(self._prefix) else full_key

    def _scrub(self, text: str) -> str:
        return redact(text, self._secrets)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise StorageError(f"{self._url}: the store is closed")
        return get_runtime().run(coro)

    async def _call(
        self, op: str, key: str, fn: Callable[[Any, int], Awaitable[T]], *, upload_bytes: int | None = None
    ) -> T:
        """Run ``fn(client, attempt)`` with retries; translate the final failure into a StorageError.

        Uploads (``upload_bytes`` given) also get a deadline per attempt: the socket read timeout does
        not cover a send that a dead endpoint stopped accepting.
        """
        client = await get_runtime().client(self._cfg)
        deadline = None
        if upload_bytes is not None:
            deadline = self._cfg.connect_timeout + self._cfg.read_timeout + upload_bytes / _MIN_UPLOAD_RATE
        attempt = 0
        while True:
            attempt += 1
            scope = asyncio.timeout(deadline)
            try:
                try:
                    async with scope:
                        return await fn(client, attempt)
                except TimeoutError as exc:
                    if not scope.expired():
                        raise  # a socket timeout inside the call
                    raise AttemptTimeout(f"no answer within {deadline:.0f} s") from exc
            except StorageError:
                raise
            except botocore.exceptions.NoCredentialsError as exc:
                raise StorageError(
                    f"{self._url}: S3 {op} {key!r}: no AWS credentials found (give access_key/secret_key, set "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or run with an instance role)"
                ) from exc
            except Exception as exc:
                if not is_retryable(exc) or attempt >= self._max_attempts:
                    error = self._translate(op, key, exc, attempt)
                    # A server's error text can echo the access key id: keep it out of tracebacks too
                    # (the translated message already carries the code and the scrubbed text).
                    raise error from (None if isinstance(exc, botocore.exceptions.ClientError) else exc)
                delay = random.uniform(0, min(self._max_delay, self._base_delay * 2 ** (attempt - 1)))
                log.warning(
                    "%s: S3 %s %r failed (%s); retrying in %.2f s (attempt %d of %d)",
                    self._url,
                    op,
                    key,
                    self._scrub(describe_error(exc)),
                    delay,
                    attempt,
                    self._max_attempts,
                )
                await asyncio.sleep(delay)

    def _translate(self, op: str, key: str, exc: Exception, attempts: int) -> StorageError:
        if isinstance(exc, botocore.exceptions.ClientError):
            code = error_code(exc)[0]
            if code in NOT_FOUND_CODES:
                return ObjectNotFoundError(key, self._url)
            if code == "NoSuchBucket":
                return StorageError(f"{self._url}: bucket {self._bucket!r} does not exist ({op} {key!r})")
            if code in ("PreconditionFailed", "412"):
                return ObjectExistsError(key)
            if is_unsupported(exc):
                operation = exc.operation_name or op
                where = f"the S3 endpoint at {self._endpoint_url}" if self._endpoint_url else "the S3 endpoint"
                return UnsupportedOperationError(
                    self._scrub(
                        f"{self._url}: {where} does not implement {operation}, needed for {op} {key!r}: "
                        f"{describe_error(exc).rstrip('.')} (not retried)"
                    ),
                    operation,
                )
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        where = f" at {self._endpoint_url}" if self._endpoint_url else ""
        kind = TransientStorageError if is_retryable(exc) else StorageError
        return kind(self._scrub(f"{self._url}: S3 {op} {key!r} failed{tries}{where}: {describe_error(exc)}"))

    # --- ObjectStore ---------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes | memoryview,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        return self._run(self._put(key, data, metadata, if_absent=if_absent))

    def put_many(self, objects: Sequence[tuple[str, bytes | memoryview, Mapping[str, str] | None]]) -> None:
        """The PUTs at once (each with its own retries): a segment's records, data and index in one round trip's
        time instead of one after the other. Every PUT has ended when this returns or raises (the first failure):
        one still running after a failure could land after the retry that cleans up behind it."""

        async def all_of() -> None:
            puts = (self._put(key, data, metadata) for key, data, metadata in objects)
            for outcome in await asyncio.gather(*puts, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome

        self._run(all_of())

    async def _put(
        self, key: str, data: bytes | memoryview, metadata: Mapping[str, str] | None, *, if_absent: bool = False
    ) -> ObjectInfo:
        check_key(key)
        meta = normalize_metadata(metadata)
        body = bytes(data) if isinstance(data, memoryview) else data
        full = self._full(key)

        async def attempt(client: Any, number: int) -> dict[str, Any]:
            extra = {"IfNoneMatch": "*"} if if_absent else {}
            try:
                put: dict[str, Any] = await client.put_object(
                    Bucket=self._bucket, Key=full, Body=body, Metadata=meta, **extra
                )
                return put
            except botocore.exceptions.ClientError as exc:
                code, status, _ = error_code(exc)
                if not if_absent or (code != "PreconditionFailed" and status != 412):
                    raise
                if number > 1 and await self._same_object(client, full, body, meta):
                    # An earlier attempt that we saw fail had in fact created the object.
                    return {}
                raise ObjectExistsError(key) from None

        await self._call("put", key, attempt, upload_bytes=len(body))
        return ObjectInfo(key, len(body), meta, time.time())  # PutObject does not return Last-Modified

    async def _same_object(self, client: Any, full: str, body: bytes, meta: dict[str, str]) -> bool:
        try:
            head = await client.head_object(Bucket=self._bucket, Key=full)
        except botocore.exceptions.ClientError:
            return False
        etag = str(head.get("ETag", "")).strip('"')
        return etag == hashlib.md5(body, usedforsecurity=False).hexdigest() and head.get("Metadata", {}) == meta

    def get(self, key: str) -> bytes:
        check_key(key)

        async def attempt(client: Any, number: int) -> bytes:
            resp = await client.get_object(Bucket=self._bucket, Key=self._full(key))
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
            return data

        return self._run(self._call("get", key, attempt))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_key(key)
        if start < 0 or length < 0:
            raise ValueError(f"get_range({key!r}, {start}, {length}): start and length must be >= 0")
        if length == 0:
            self.head(key)  # still report a missing key
            return b""

        async def attempt(client: Any, number: int) -> bytes:
            try:
                resp = await client.get_object(
                    Bucket=self._bucket, Key=self._full(key), Range=f"bytes={start}-{start + length - 1}"
                )
            except botocore.exceptions.ClientError as exc:
                if error_code(exc)[0] == "InvalidRange":
                    return b""  # start at or past the end of the object
                raise
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
            if "ContentRange" not in resp:
                return data[start : start + length]  # a server that ignores Range sends the whole object
            return data

        return self._run(self._call("get_range", key, attempt))

    def head(self, key: str) -> ObjectInfo:
        check_key(key)

        async def attempt(client: Any, number: int) -> ObjectInfo:
            resp = await client.head_object(Bucket=self._bucket, Key=self._full(key))
            modified = resp.get("LastModified")
            return ObjectInfo(
                key,
                int(resp.get("ContentLength", 0)),
                {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()},
                modified.timestamp() if modified else 0.0,
            )

        return self._run(self._call("head", key, attempt))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        token: str | None = None
        while True:
            tok = token

            async def attempt(client: Any, number: int, tok: str | None = tok) -> dict[str, Any]:
                extra = {"ContinuationToken": tok} if tok else {}
                listed: dict[str, Any] = await client.list_objects_v2(
                    Bucket=self._bucket, Prefix=self._full(prefix), **extra
                )
                return listed

            page = self._run(self._call("list", prefix, attempt))
            for obj in page.get("Contents", []) or []:
                modified = obj.get("LastModified")
                yield ObjectInfo(
                    self._strip(obj["Key"]), int(obj.get("Size", 0)), {}, modified.timestamp() if modified else 0.0
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, key: str) -> None:
        check_key(key)

        async def attempt(client: Any, number: int) -> None:
            await client.delete_object(Bucket=self._bucket, Key=self._full(key))

        self._run(self._call("delete", key, attempt))

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        check_key(key)
        meta = normalize_metadata(metadata)

        async def attempt(client: Any, number: int) -> str:
            resp = await client.create_multipart_upload(Bucket=self._bucket, Key=self._full(key), Metadata=meta)
            return str(resp["UploadId"])

        # A retried create may leave an extra, empty upload behind; pending_multiparts finds it for cleanup.
        upload_id = self._run(self._call("start_multipart", key, attempt))
        return S3MultipartWrite(self, key, upload_id)

    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        check_key(key)
        # ListMultipartUploads rather than ListParts where it exists: some servers (moto) answer ListParts
        # for an upload id under any key. Endpoints without it get ListParts, which is what AWS checks.
        if not self._no_list_uploads:
            try:
                found = any(u.key == key and u.upload_id == upload_id for u in self._pending(key))
            except UnsupportedOperationError:
                self._no_list_uploads = True
            else:
                if not found:
                    raise UploadNotFoundError(key, upload_id, self._url)
                return S3MultipartWrite(self, key, upload_id)
        self._run(self._list_parts(key, upload_id, max_parts=1))
        return S3MultipartWrite(self, key, upload_id)

    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        check_prefix(prefix)
        return self._pending(prefix)

    def _pending(self, prefix: str) -> Iterator[PendingUpload]:
        markers: dict[str, str] = {}
        while True:
            current = dict(markers)

            async def attempt(client: Any, number: int, current: dict[str, str] = current) -> dict[str, Any]:
                uploads: dict[str, Any] = await client.list_multipart_uploads(
                    Bucket=self._bucket, Prefix=self._full(prefix), **current
                )
                return uploads

            page = self._run(self._call("pending_multiparts", prefix, attempt))
            for upload in page.get("Uploads", []) or []:
                initiated = upload.get("Initiated")
                yield PendingUpload(
                    self._strip(upload["Key"]), str(upload["UploadId"]), initiated.timestamp() if initiated else 0.0
                )
            if not page.get("IsTruncated"):
                return
            markers = {
                "KeyMarker": page.get("NextKeyMarker", ""),
                "UploadIdMarker": page.get("NextUploadIdMarker", ""),
            }

    # --- multipart internals -------------------------------------------------------------------------

    async def _list_parts(self, key: str, upload_id: str, max_parts: int = 0) -> dict[int, tuple[str, int]]:
        """``{part number: (etag, size)}`` of an upload, from ListParts (so resumed uploads work); with
        ``max_parts``, only the first page of at most that many (enough to know the upload exists)."""
        parts: dict[int, tuple[str, int]] = {}
        marker = 0
        while True:

            async def attempt(client: Any, number: int, marker: int = marker) -> dict[str, Any]:
                extra: dict[str, Any] = {"PartNumberMarker": marker} if marker else {}
                if max_parts:
                    extra["MaxParts"] = max_parts
                try:
                    listed: dict[str, Any] = await client.list_parts(
                        Bucket=self._bucket, Key=self._full(key), UploadId=upload_id, **extra
                    )
                except botocore.exceptions.ClientError as exc:
                    if error_code(exc)[0] in ("NoSuchUpload", "404"):
                        raise UploadNotFoundError(key, upload_id, self._url) from None
                    raise
                return listed

            page = await self._call("list_parts", key, attempt)
            for part in page.get("Parts", []) or []:
                parts[int(part["PartNumber"])] = (str(part["ETag"]), int(part.get("Size", 0)))
            if not page.get("IsTruncated") or max_parts:
                return parts
            marker = int(page.get("NextPartNumberMarker") or 0)

    def _write_part(self, key: str, upload_id: str, part_number: int, data: Buffer) -> str:
        body = bytes(data) if isinstance(data, memoryview) else data

        async def attempt(client: Any, number: int) -> str:
            try:
                resp = await client.upload_part(
                    Bucket=self._bucket, Key=self._full(key), UploadId=upload_id, PartNumber=part_number, Body=body
                )
            except botocore.exceptions.ClientError as exc:
                code, status, _ = error_code(exc)
                if code in ("NoSuchUpload", "404") or (
                    status >= 500 and not await self._upload_exists(client, key, upload_id)
                ):
                    # (Some servers, moto among them, answer 500 for a part of an aborted upload.)
                    raise UploadNotFoundError(key, upload_id, self._url) from None
                raise
            return str(resp["ETag"])

        return self._run(self._call(f"write_part {part_number} of", key, attempt, upload_bytes=len(body)))

    async def _upload_exists(self, client: Any, key: str, upload_id: str) -> bool:
        try:
            await client.list_parts(Bucket=self._bucket, Key=self._full(key), UploadId=upload_id, MaxParts=1)
        except botocore.exceptions.ClientError as exc:
            return error_code(exc)[0] not in ("NoSuchUpload", "404")
        except Exception:
            return True  # unknown: let the caller's retry decide
        return True

    def _complete(self, key: str, upload_id: str, part_numbers: Sequence[int]) -> ObjectInfo:
        numbers = check_part_list(part_numbers)

        async def run() -> None:
            parts = await self._list_parts(key, upload_id)
            missing = [n for n in numbers if n not in parts]
            if missing:
                raise StorageError(
                    f"{self._url}: complete {key!r} (upload {upload_id}): parts {missing} were never written; "
                    f"written parts are {sorted(parts)}"
                )
            listing = [{"PartNumber": n, "ETag": parts[n][0]} for n in numbers]
            digest = hashlib.md5(usedforsecurity=False)
            for n in numbers:
                digest.update(bytes.fromhex(parts[n][0].strip('"').split("-")[0]))
            expected_etag = f"{digest.hexdigest()}-{len(numbers)}"

            async def attempt(client: Any, number: int) -> None:
                try:
                    await client.complete_multipart_upload(
                        Bucket=self._bucket,
                        Key=self._full(key),
                        UploadId=upload_id,
                        MultipartUpload={"Parts": listing},
                    )
                except botocore.exceptions.ClientError as exc:
                    code = error_code(exc)[0]
                    if code == "EntityTooSmall":
                        small = [n for n in numbers[:-1] if parts[n][1] < MIN_PART_SIZE]
                        raise PartTooSmallError(
                            f"{self._url}: complete {key!r} (upload {upload_id}): every part but the last must "
                            f"have at least {MIN_PART_SIZE} bytes (5 MiB); too small: "
                            + ", ".join(f"part {n} ({parts[n][1]} bytes)" for n in small)
                            + ". The upload is kept: rewrite those parts and complete again, or abort it."
                        ) from None
                    if code in ("NoSuchUpload", "404"):
                        if number > 1 and await self._has_etag(client, key, expected_etag):
                            return  # an earlier attempt we saw fail had completed it
                        raise UploadNotFoundError(key, upload_id, self._url) from None
                    raise

            # On failure the upload is left as it is: the caller may retry complete() or abort().
            await self._call("complete", key, attempt)

        self._run(run())
        return self.head(key)

    async def _has_etag(self, client: Any, key: str, etag: str) -> bool:
        try:
            head = await client.head_object(Bucket=self._bucket, Key=self._full(key))
        except botocore.exceptions.ClientError:
            return False
        return str(head.get("ETag", "")).strip('"') == etag

    def _abort(self, key: str, upload_id: str) -> None:
        async def attempt(client: Any, number: int) -> None:
            try:
                await client.abort_multipart_upload(Bucket=self._bucket, Key=self._full(key), UploadId=upload_id)
            except botocore.exceptions.ClientError as exc:
                if error_code(exc)[0] not in ("NoSuchUpload", "404"):
                    raise

        self._run(self._call("abort", key, attempt))


class S3MultipartWrite(MultipartWrite):
    """An S3 multipart upload. ``complete`` looks the parts' ETags up with ListParts, so a write resumed
    in another process (``S3Store.resume_multipart``) completes the same way as the original."""

    def __init__(self, store: S3Store, key: str, upload_id: str) -> None:
        self.key = key
        self.upload_id = upload_id
        self._store = store

    def __repr__(self) -> str:
        return f"S3MultipartWrite(key={self.key!r}, upload_id={self.upload_id!r}, store={self._store.url!r})"

    def write_part(self, part_number: int, data: PartData) -> None:
        check_part_number(part_number)
        buffers = part_buffers(data)
        self._store._write_part(
            self.key, self.upload_id, part_number, buffers[0] if len(buffers) == 1 else b"".join(buffers)
        )

    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo:
        return self._store._complete(self.key, self.upload_id, part_numbers)

    def abort(self) -> None:
        self._store._abort(self.key, self.upload_id)
