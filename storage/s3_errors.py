"""How ``S3Store`` reads a failed S3 call: which errors are worth another attempt, which mean the endpoint
lacks the API, and the codes and one-line descriptions its messages use.

Retried: throttling (SlowDown, 429, 503), other 5xx, request timeouts, connection errors and 409
ConditionalRequestConflict (AWS's answer to concurrent conditional writes on one key). Never retried: an answer
that says the API does not exist on this endpoint (501 NotImplemented, 405 MethodNotAllowed).
"""

from __future__ import annotations

import aiohttp
import botocore.exceptions

from streamoffload.storage.base import StorageError

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "PriorRequestNotComplete",
    }
)
_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    botocore.exceptions.HTTPClientError,  # ReadTimeoutError, ResponseStreamingError, ...
    botocore.exceptions.IncompleteReadError,
    aiohttp.ClientError,
    TimeoutError,  # asyncio's too
    ConnectionError,
)
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict"})
"""409 answers worth retrying: AWS returns ConditionalRequestConflict when conditional writes on one key race."""
_UNSUPPORTED_CODES = frozenset({"NotImplemented", "MethodNotAllowed"})
_UNSUPPORTED_STATUSES = frozenset({501, 405})
"""Answers meaning "this endpoint has no such API": retrying cannot help."""
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class UnsupportedOperationError(StorageError):
    """The S3 endpoint does not implement an operation (501 NotImplemented, 405 MethodNotAllowed)."""

    def __init__(self, message: str, operation: str) -> None:
        self.operation = operation
        super().__init__(message)


class AttemptTimeout(TimeoutError):
    """An upload attempt that did not finish in time."""


def error_code(exc: botocore.exceptions.ClientError) -> tuple[str, int, str]:
    error = exc.response.get("Error", {}) or {}
    status = int((exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode") or 0)
    return str(error.get("Code", "") or status), status, str(error.get("Message", "") or "")


def is_unsupported(exc: BaseException) -> bool:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    code, status, _ = error_code(exc)
    return code in _UNSUPPORTED_CODES or status in _UNSUPPORTED_STATUSES


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        if is_unsupported(exc):
            return False
        code, status, _ = error_code(exc)
        return code in _THROTTLE_CODES or code in _CONFLICT_CODES or status == 429 or status >= 500
    return isinstance(exc, _NETWORK_ERRORS)


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status, message = error_code(exc)
        return f"{code} (HTTP {status})" + (f": {message}" if message and message != code else "")
    return f"{type(exc).__name__}: {exc}"
