"""What the code uses of protobuf's runtime that its typeshed stubs (types-protobuf) do not declare: parsing
straight from a buffer (upb reads any bytes-like object, so a slice of a block is parsed without a copy), and
the names of the required fields a parsed message lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

_M = TypeVar("_M", bound=Message)

Buffer = bytes | bytearray | memoryview


def parse_from(message: Message, data: Buffer) -> None:
    """``message.ParseFromString(data)`` for any bytes-like ``data`` (the stubs say ``bytes``)."""
    message.ParseFromString(data)  # type: ignore[arg-type]


def from_buffer(cls: type[_M]) -> Callable[[Buffer], _M]:
    """``cls.FromString`` itself, typed to take any bytes-like object (the stubs say ``bytes``)."""
    parse: Callable[[Buffer], _M] = cls.FromString  # type: ignore[assignment]
    return parse


def missing_fields(message: Message) -> str:
    """The required fields ``message`` lacks, comma-separated (``FindInitializationErrors``)."""
    errors: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
    return ", ".join(errors)
