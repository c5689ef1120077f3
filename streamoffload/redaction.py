"""Secrets out of every text this project shows or keeps: ``redact`` (the one redaction function, for errors
and log lines), the logging filter that applies it to every record a handler of ours writes
(``RedactingFilter``, botocore's and aiobotocore's request headers at DEBUG included), and log files that only
their owner can read (``private_opener``, ``PrivateFileHandler``). A leaf module: every layer may import it.

What is masked (``***``): the user information of a URL (``scheme://user:password@host``); the value of a
query parameter or ``key=value`` whose key names a secret (``X-Amz-Signature``, ``X-Amz-Credential``,
``X-Amz-Security-Token``, ``password``, ``token``, ``authParams``, ``...secret...``, ``sig``, ...); the
same keys quoted in a dict or JSON text (``'Authorization': b'...'``); header lines (``Authorization:``,
``x-amz-security-token:``, ``Cookie:``); a SigV4 ``Signature:`` in hex; Pulsar tokens (``token:...``, JWTs);
AWS access key ids; and every value handed to ``register_secret`` (the store's credentials, the broker's
token), wherever it appears."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

MASK = "***"

_SECRET_WORDS = (
    r"signature|credential|token|secret|password|passwd|pwd|api[-_]?key|access[-_]?key|private[-_]?key"
    r"|auth[-_]?params|authorization|cookie"
)
_SECRET_KEY = rf"(?:[\w.-]*(?:{_SECRET_WORDS})[\w.-]*|sig)"
"""A name whose value is a secret: any name containing one of the words, or exactly ``sig`` (Azure SAS). Not a
bare ``key``: an S3 request's ``Key`` is the object's name, which a debug log should show."""

_VALUE = r"[^\s&,;'\"<>}\])]"
"""A character of an unquoted value (a value never ends with ``:``, so "...Signature=abc: error" keeps ": ")."""

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://userinfo@host: all of the user information (an access key id is often the "user").
    (re.compile(r"(?i)(?<![\w+.-])([a-z][a-z0-9+.-]*://)[^\s/?#@'\"<>]+@"), rf"\1{MASK}@"),
    # 'name': b'value' or "name": "value" (a dict's repr, JSON): botocore's request headers at DEBUG.
    (
        re.compile(rf"(?i)(['\"])({_SECRET_KEY})\1(\s*:\s*)(b?)(['\"])(?:\\.|(?!\5).)*\5"),
        rf"\1\2\1\3\4\5{MASK}\5",
    ),
    # Header lines (a canonical request, an HTTP dump, possibly inside a bytes repr with literal \r\n).
    (
        re.compile(
            r"(?im)(?:(?<![\w-])|(?<=\\n))(authorization|proxy-authorization|x-amz-security-token|cookie|set-cookie)"
            r"(\s*:\s*)(?:(?!\\[rn])[^\r\n])+"
        ),
        rf"\1\2{MASK}",
    ),
    # name=value, in a query (?a=b&X-Amz-Signature=...), a header's parameters (Credential=..., Signature=...),
    # a configuration line (password = 'x').
    (
        re.compile(rf"(?i)(?<![\w.-])({_SECRET_KEY})(\s*=\s*)(?:'[^']*'|\"[^\"]*\"|{_VALUE}*[^\s&,;'\"<>}}\]):])"),
        rf"\1\2{MASK}",
    ),
    # A SigV4 signature logged on its own ("Signature:\n<hex>", botocore.auth at DEBUG).
    (re.compile(r"(?i)(?<![\w-])(signature)(\s*:\s*)[0-9a-f]{16,}"), rf"\1\2{MASK}"),
    # Pulsar's token authentication parameters (token:...) and JSON web tokens anywhere.
    (re.compile(r"(?i)(?<![\w-])(token:)[^\s,'\"}]+"), rf"\1{MASK}"),
    (re.compile(r"\beyJ[\w-]{4,}\.[\w-]{4,}\.[\w-]*"), MASK),
    # AWS access key ids (AKIA... long-term, ASIA... temporary).
    (re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), MASK),
)

MIN_REGISTERED = 8
"""The shortest value ``register_secret`` keeps: a shorter one would mask ordinary words everywhere (it is still
masked where the rules above find it)."""

_registered: frozenset[str] = frozenset()
_lock = threading.Lock()


def register_secret(*values: str | None) -> None:
    """Have ``redact`` mask these values wherever they appear, from now on, in this process (credentials a
    server might echo in an error body, which no pattern could tell from other text). Empty, ``None`` and
    short values (under ``MIN_REGISTERED`` characters) are ignored."""
    global _registered
    new = {v for v in values if isinstance(v, str) and len(v) >= MIN_REGISTERED}
    if new - _registered:
        with _lock:
            _registered = _registered | new


def secret_name(name: str) -> bool:
    """Whether the value of a setting called ``name`` is a secret (``spark.hadoop.fs.s3a.secret.key``,
    ``authParams``, ...): the names whose ``name=value`` ``redact`` masks."""
    return re.fullmatch(rf"(?i){_SECRET_KEY}", name.strip()) is not None


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every secret it carries masked (module docstring); ``secrets``: more values to mask, of
    any length. Idempotent, and the identity on text without secrets."""
    known = sorted({*_registered, *(s for s in secrets if s)}, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


_EXCEPTIONS = logging.Formatter()


class RedactingFilter(logging.Filter):
    """A handler filter that redacts the record in place (message, exception text, stack), so this handler and
    any that sees the record after it write no secret. It never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the handler reports it as usual
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = _EXCEPTIONS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def private_opener(path: str, flags: int) -> int:
    """An ``open(..., opener=)`` that creates the file with mode 0600 (read and write for its owner only), in
    the one ``open`` call: never readable by others, not even for a moment. An existing file keeps its mode."""
    return os.open(path, flags, 0o600)


class PrivateFileHandler(logging.FileHandler):
    """A ``logging.FileHandler`` whose file is created with mode 0600 (``private_opener``) and whose records are
    redacted (``RedactingFilter``)."""

    def __init__(self, filename: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(filename, **kwargs)
        self.addFilter(RedactingFilter())

    def _open(self) -> Any:
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors, opener=private_opener)


__all__ = [
    "MASK",
    "PrivateFileHandler",
    "RedactingFilter",
    "private_opener",
    "redact",
    "register_secret",
    "secret_name",
]
