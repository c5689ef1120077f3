"""Store URLs: ``file:///abs/dir`` (or a plain path) and ``s3://bucket/prefix``, parsed by one parser
(``parse_store_url``) for every caller, and opened as stores (``open_store``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from streamoffload.errors import ConfigError
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.request_counts import maybe_counting

FILESYSTEM_OPTIONS = frozenset({"fsync", "file_mode", "dir_mode"})
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
        raise ConfigError(f"store {url}: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return options


class StoreNotFoundError(ConfigError):
    """``open_store(..., create=False)`` of a filesystem store whose directory does not exist."""


@dataclass(frozen=True)
class StoreURL:
    """A store URL, parsed and checked (``parse_store_url``): what ``open_store`` opens and what the
    command line's ``--store`` configures."""

    scheme: str
    """``"file"`` or ``"s3"``."""
    path: str = ""
    """file: the directory, unquoted, as given (a plain path may be relative)."""
    bucket: str = ""
    """s3: the bucket."""
    prefix: str = ""
    """s3: the key prefix inside the bucket, unquoted, without leading or trailing ``/``."""

    @property
    def store_class(self) -> type[ObjectStore]:
        """The class that opens this URL, without opening anything: its class attributes (``min_part_size``)
        are known before a store is opened or an endpoint reached."""
        if self.scheme == "s3":
            from streamoffload.storage.s3 import S3Store

            return S3Store
        from streamoffload.storage.filesystem import FilesystemStore

        return FilesystemStore


def is_url(location: str) -> bool:
    """Whether a location (a store, a checkpoint) is written as a URL (``scheme://...``) rather than a path:
    the one test of it, for every caller."""
    return "://" in location


def parse_store_url(url: str) -> StoreURL:
    """The one parser of store URLs: ``file:///abs/dir``, ``file://localhost/abs/dir``, ``/abs/dir`` or
    ``rel/dir`` (no ``://``: a path), ``s3://bucket`` or ``s3://bucket/prefix``.

    Raises ``ConfigError`` ("store URL <url>: <what is wrong>") for an empty URL, other schemes, a file URL
    with a host, query or relative path, an s3 URL without bucket or with a query; credentials inside an s3
    URL are refused without echoing them (they would end up in logs)."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL is empty")
    if not is_url(url):
        return StoreURL("file", path=url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"store URL {url}: file URLs name a local path (file:///dir), not host {parts.netloc!r}")
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {url}: file URLs take no query or fragment")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ConfigError(f"store URL {url}: the path of a file URL must be absolute (file:///abs/dir)")
        return StoreURL("file", path=path)
    if scheme == "s3":
        # urlsplit would put user:password@ into netloc; refuse without echoing it.
        if "@" in parts.netloc:
            raise ConfigError("store URL: credentials in s3:// URLs are not allowed (use options or the AWS chain)")
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {url}: s3 URLs take no query or fragment")
        if not parts.netloc:
            raise ConfigError(f"store URL {url}: missing bucket (s3://bucket/prefix)")
        return StoreURL("s3", bucket=parts.netloc, prefix=unquote(parts.path).strip("/"))
    raise ConfigError(f"store URL {url}: unsupported scheme {parts.scheme!r} (use file:///dir or s3://bucket/prefix)")


def open_store(url: str, *, create: bool = True, **options: Any) -> ObjectStore:
    """The store at ``url`` (any URL ``parse_store_url`` accepts; its ``ConfigError`` otherwise).

    - a file URL or a path: a ``FilesystemStore`` (options ``fsync``, ``file_mode`` and ``dir_mode``:
      permissions of what it creates, 0600/0700 by default);
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
