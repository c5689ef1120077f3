"""Open an object store from a URL: ``file:///abs/dir`` (or a plain path) and ``s3://bucket/prefix``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from streamoffload.errors import ConfigError
from streamoffload.storage.base import ObjectStore

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


def open_store(url: str, *, create: bool = True, **options: Any) -> ObjectStore:
    """The store at ``url``.

    - ``file:///abs/dir``, ``file://localhost/abs/dir``, ``/abs/dir`` or ``rel/dir``: a ``FilesystemStore``
      (options ``fsync``, ``file_mode`` and ``dir_mode``: permissions of what it creates, 0600/0700 by default);
    - ``s3://bucket`` or ``s3://bucket/prefix``: an ``S3Store`` (options ``endpoint_url``, ``region``,
      ``path_style``, ``access_key``, ``secret_key``, ``session_token``, ``profile``, ``max_attempts``, ...).
      Options that are ``None`` are dropped, so config values can be passed through as they are.

    Raises ``ConfigError`` for other schemes, unknown options and malformed URLs. Credentials are
    never accepted inside the URL (they would end up in logs); pass them as options or use the AWS chain.

    ``create=False`` opens an existing store only: a filesystem store whose directory does not exist
    raises ``StoreNotFoundError`` naming the path, and nothing is created (commands that only read or
    mark an existing store use it, so a mistyped path is an error and not a new empty store). S3 stores
    never create their bucket, so the flag changes nothing for them.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("store URL is empty")
    options = {k: v for k, v in options.items() if v is not None}
    if "://" not in url:
        return _filesystem(url, Path(url), options, create)
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
        return _filesystem(url, Path(path), options, create)
    if scheme == "s3":
        # urlsplit would put user:password@ into netloc; refuse without echoing it.
        if "@" in parts.netloc:
            raise ConfigError("store URL: credentials in s3:// URLs are not allowed (use options or the AWS chain)")
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {url}: s3 URLs take no query or fragment")
        bucket = parts.netloc
        if not bucket:
            raise ConfigError(f"store URL {url}: missing bucket (s3://bucket/prefix)")
        from streamoffload.storage.s3 import S3Store

        return S3Store(bucket, unquote(parts.path).strip("/"), **_check_options(url, options, S3_OPTIONS))
    raise ConfigError(f"store URL {url}: unsupported scheme {parts.scheme!r} (use file:///dir or s3://bucket/prefix)")


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
