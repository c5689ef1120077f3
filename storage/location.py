"""Where the store is: ``StoreLocation`` (a directory, or an S3 bucket and key prefix, and how to reach it), built
once from the configuration or from a store URL (``file:///abs/dir``, a plain path, ``s3://bucket/prefix``) by the
one parser (``parse_store_url``), and opened as a ``ScopedStore`` (the store and its key prefix, passed as one).
``open_store`` opens a URL as a bare ``ObjectStore`` (tests, benches, tools); ``is_url`` is the one test of
"is this a URL"."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from streamoffload.errors import ConfigError
from streamoffload.redaction import redact
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.request_counts import maybe_counting

FILESYSTEM_OPTIONS = frozenset({"fsync", "sync", "file_mode", "dir_mode"})
S3_OPTIONS = frozenset(
    {
        "endpoint_url",
        "region",
        "path_style",
        "access_key",
        "secret_key",
        "session_token",
        "profile",
        "max_attempts",
        "retry_base_delay",
        "retry_max_delay",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "checksums",
    }
)


def _check_options(url: str, options: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise ConfigError(f"store {redact(url)}: unknown option(s) {', '.join(unknown)}; allowed: {known}")
    return options


class StoreNotFoundError(ConfigError):
    """``open_store(..., create=False)`` of a filesystem store whose directory does not exist."""


@dataclass(frozen=True)
class ScopedStore:
    """An open store and the key prefix everything of this project lives under in it: what ``StoreLocation.open``
    returns and what code that reads or writes the store takes, as one argument.

    ``prefix`` is the key prefix inside ``store`` without leading or trailing ``/`` ("" for none). The keys
    built from it (``storage.keys``) are relative to the store's root, prefix included: on S3 the store is
    the bucket's root, so manifests record data keys relative to the bucket, as Pulsar's readers expect."""

    store: ObjectStore
    prefix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", self.prefix.strip("/"))

    def describe(self) -> str:
        """The store's URL and the prefix, for messages."""
        return self.store.url + (f" under prefix {self.prefix!r}" if self.prefix else "")


@dataclass(frozen=True)
class StoreLocation:
    """Where the store is: a filesystem directory or an S3 bucket and key prefix, with how to reach and write it.
    Built once, from the configuration (``StoreSettings.location``) or a URL (``parse_store_url``); plain values,
    so it pickles (Spark ships it to executors, which ``open`` it there).

    An S3 location opens the bucket's root and scopes it to ``prefix``, so keys (and the data keys manifests
    record) are relative to the bucket, prefix included."""

    scheme: str
    """``"file"`` or ``"s3"``."""
    path: str = ""
    """file: the directory, unquoted (from a URL as given: a plain path may be relative; from the configuration,
    resolved)."""
    bucket: str = ""
    """s3: the bucket."""
    prefix: str = ""
    """The key prefix inside the store (s3: inside the bucket), unquoted, without leading or trailing ``/``. A
    filesystem store from the configuration or a URL has none (its keys start at the directory)."""
    endpoint: str | None = None
    """s3: the endpoint URL (None: AWS itself)."""
    region: str | None = None
    """s3: the region (None: the AWS chain's)."""
    path_style: bool = False
    """s3: path-style addressing (``endpoint/bucket/key``), as local S3 servers want."""
    file_mode: int | None = None
    """file: permissions of the files the store creates (None: ``FilesystemStore``'s default, 0600)."""
    dir_mode: int | None = None
    """file: permissions of its directories (None: the one that goes with ``file_mode``)."""
    sync: str | None = None
    """file: how writes are made durable (``FilesystemStore``'s ``sync``; None: its default, a group commit)."""

    @property
    def store_class(self) -> type[ObjectStore]:
        """The class that opens this location, without opening anything: its class attributes (``min_part_size``)
        are known before a store is opened or an endpoint reached."""
        if self.scheme == "s3":
            from streamoffload.storage.s3 import S3Store

            return S3Store
        from streamoffload.storage.filesystem import FilesystemStore

        return FilesystemStore

    @property
    def min_part_size(self) -> int:
        """The smallest part but the last of a multipart upload to this store (the segmenter's minimum part)."""
        return self.store_class.min_part_size

    @property
    def part_size(self) -> int:
        """The bytes the segmenter gathers into a part for this store (``ObjectStore.part_size``)."""
        return self.store_class.part_size

    def describe(self) -> str:
        """The location as a URL, for messages and logs (never parsed again)."""
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return Path(os.path.abspath(self.path)).as_uri()

    def open(self, *, create: bool = True) -> ScopedStore:
        """The store, scoped to the key prefix. ``create=False`` opens an existing store only (a filesystem
        store whose directory is missing raises ``StoreNotFoundError``; see ``open_store``)."""
        if self.scheme == "s3":
            from streamoffload.storage.s3 import S3Store

            store: ObjectStore = S3Store(
                self.bucket, "", endpoint_url=self.endpoint, region=self.region, path_style=self.path_style
            )
            return ScopedStore(maybe_counting(store), self.prefix)
        modes: dict[str, int | str | None] = {"file_mode": self.file_mode, "dir_mode": self.dir_mode, "sync": self.sync}
        options = {k: v for k, v in modes.items() if v is not None}
        return ScopedStore(maybe_counting(_filesystem(self.path, Path(self.path), options, create)), self.prefix)


def is_url(location: str) -> bool:
    """Whether a location (a store, a checkpoint) is written as a URL (``scheme://...``) rather than a path:
    the one test of it, for every caller."""
    return "://" in location


def parse_store_url(url: str, *, endpoint: str | None = None, region: str | None = None) -> StoreLocation:
    """The one parser of store URLs: ``file:///abs/dir``, ``file://localhost/abs/dir``, ``/abs/dir`` or
    ``rel/dir`` (no ``://``: a path), ``s3://bucket`` or ``s3://bucket/prefix``. ``endpoint`` and ``region``
    apply to s3 URLs (an endpoint means path-style addressing, as local S3 servers want).

    Raises ``ConfigError`` ("store URL <url>: <what is wrong>") for an empty URL, other schemes, a file URL
    with a host, query or relative path, an s3 URL without bucket or with a query. The message shows the URL
    through ``redaction.redact``: credentials (``user:secret@``) and secret query values (a presigned URL's
    ``X-Amz-Signature``, ...) are masked, never echoed."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL is empty")
    if not is_url(url):
        return StoreLocation("file", path=url)
    shown = redact(url)  # user:password@ and a presigned query's signature never reach a message
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            host = parts.netloc.rpartition("@")[2]
            raise ConfigError(f"store URL {shown}: file URLs name a local path (file:///dir), not host {host!r}")
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {shown}: file URLs take no query or fragment")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ConfigError(f"store URL {shown}: the path of a file URL must be absolute (file:///abs/dir)")
        return StoreLocation("file", path=path)
    if scheme == "s3":
        if "@" in parts.netloc:
            raise ConfigError(
                f"store URL {shown}: credentials in s3:// URLs are not allowed (use options or the AWS chain)"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {shown}: s3 URLs take no query or fragment")
        if not parts.netloc:
            raise ConfigError(f"store URL {shown}: missing bucket (s3://bucket/prefix)")
        return StoreLocation(
            "s3",
            bucket=parts.netloc,
            prefix=unquote(parts.path).strip("/"),
            endpoint=endpoint,
            region=region,
            path_style=endpoint is not None,
        )
    raise ConfigError(f"store URL {shown}: unsupported scheme {parts.scheme!r} (use file:///dir or s3://bucket/prefix)")


def open_store(url: str, *, create: bool = True, **options: Any) -> ObjectStore:
    """The store at ``url`` (any URL ``parse_store_url`` accepts; its ``ConfigError`` otherwise).

    - a file URL or a path: a ``FilesystemStore`` (options ``fsync``, ``sync`` (``"group"`` or ``"file"``),
      ``file_mode`` and ``dir_mode``: permissions of what it creates, 0600/0700 by default);
    - ``s3://bucket`` or ``s3://bucket/prefix``: an ``S3Store`` (options ``endpoint_url``, ``region``,
      ``path_style``, ``access_key``, ``secret_key``, ``session_token``, ``profile``, ``max_attempts``, ...).
      Options that are ``None`` are dropped, so config values can be passed through as they are.

    Unknown options raise ``ConfigError``. Credentials are never accepted inside the URL; pass them as
    options or use the AWS chain.

    ``create=False`` opens an existing store only: a filesystem store whose directory does not exist
    raises ``StoreNotFoundError`` naming the path, and nothing is created (commands that only read or
    mark an existing store use it, so a mistyped path is an error and not a new empty store). S3 stores
    never create their bucket, so the flag changes nothing for them.

    With ``STREAMOFFLOAD_STORE_REQUEST_COUNTS`` in the environment the store counts its requests
    (``storage.request_counts``, for benches); otherwise it is returned as it is.
    """
    location = parse_store_url(url)
    options = {k: v for k, v in options.items() if v is not None}
    if location.scheme == "s3":
        from streamoffload.storage.s3 import S3Store

        return maybe_counting(S3Store(location.bucket, location.prefix, **_check_options(url, options, S3_OPTIONS)))
    return maybe_counting(_filesystem(url, Path(location.path), options, create))


def _filesystem(url: str, path: Path, options: dict[str, Any], create: bool = True) -> ObjectStore:
    from streamoffload.storage.filesystem import FilesystemStore

    root = os.path.abspath(path)
    checked = _check_options(url, options, FILESYSTEM_OPTIONS)
    if not create:
        # FilesystemStore creates its root; look first. (The directory may still vanish before it opens:
        # then it is created, as with any store whose directory is removed under it.)
        if not os.path.exists(root):
            raise StoreNotFoundError(f"no store at {root}: the directory does not exist")
        if not os.path.isdir(root):
            raise StoreNotFoundError(f"no store at {root}: not a directory")
    return FilesystemStore(root, **checked)
