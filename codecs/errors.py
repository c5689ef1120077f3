"""Errors of the byte formats. Each names what is wrong and, for bytes, at which offset."""

from __future__ import annotations

from streamoffload.errors import StreamOffloadError


class CodecError(StreamOffloadError):
    """The root of the byte formats' errors (this layer's one base: ``except CodecError`` sees every one)."""


class FormatError(CodecError):
    """Bytes that do not follow the format they claim to follow.

    ``offset`` is the byte offset (within the object or buffer being decoded) where the problem was
    found, and ``where`` names the object or buffer when the caller knows it.
    """

    def __init__(self, message: str, *, offset: int | None = None, where: str | None = None) -> None:
        self.reason = message
        self.offset = offset
        self.where = where
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.reason
        if self.offset is not None:
            text = f"{text} (at byte offset {self.offset})"
        if self.where:
            text = f"{self.where}: {text}"
        return text

    def located(self, where: str, base_offset: int = 0) -> FormatError:
        """The same error, named after the object it was found in and with an offset made absolute."""
        err = type(self).__new__(type(self))
        FormatError.__init__(
            err,
            self.reason,
            offset=None if self.offset is None else self.offset + base_offset,
            where=where,
        )
        return err


class BadMagicError(FormatError):
    """The magic word at the start of a block, index or entry is not the expected one."""


class TruncatedError(FormatError):
    """The buffer ends before the structure it holds does."""


class LengthMismatchError(FormatError):
    """A length field disagrees with the bytes present or with another length field."""


class ChecksumError(FormatError):
    """A CRC-32C checksum does not match the bytes it covers."""


class IndexOutOfRangeError(FormatError):
    """An index entry points outside the data object it describes."""


class DecompressionError(FormatError):
    """A compressed payload that does not inflate to exactly the size its metadata declares, within the cap.

    The one error of every codec (``codecs.compression``): ``codec`` names it, ``declared`` is the
    ``uncompressed_size`` the metadata gave, ``cap`` the bound it was held to; ``where`` names the entry."""

    def __init__(
        self,
        message: str,
        *,
        codec: str,
        declared: int,
        cap: int,
        offset: int | None = None,
        where: str | None = None,
    ) -> None:
        self.codec = codec
        self.declared = declared
        self.cap = cap
        super().__init__(message, offset=offset, where=where)

    def located(self, where: str, base_offset: int = 0) -> FormatError:
        return DecompressionError(
            self.reason,
            codec=self.codec,
            declared=self.declared,
            cap=self.cap,
            offset=None if self.offset is None else self.offset + base_offset,
            where=where,
        )


class EntryTooLargeError(CodecError):
    """An entry does not fit in one block (Pulsar silently truncated here; we refuse)."""
