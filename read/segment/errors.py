"""The errors of the read path (malformed bytes raise the codecs' ``FormatError`` subclasses)."""

from __future__ import annotations

from streamoffload.codecs.errors import FormatError
from streamoffload.errors import StreamOffloadError


class ReadError(StreamOffloadError):
    """Offloaded data cannot be read (for a reason other than its bytes being malformed)."""


class MissingObjectError(ReadError):
    """An object that a segment consists of does not exist in the store."""

    def __init__(self, message: str, key: str) -> None:
        self.key = key
        super().__init__(message)


class EntryNotFoundError(ReadError, LookupError):
    """A position that is not offloaded (not in the segment, or not in any segment of the topic)."""


class TopicNotOffloadedError(ReadError, LookupError):
    """A topic-partition with no offloaded segments under the reader's prefix."""


class UnsupportedFormatVersionError(FormatError):
    """An object's ``s3managedledgeroffloaderformatversion`` user metadata is not one this reader reads."""


class ManifestMismatchError(FormatError):
    """A segment manifest disagrees with the objects it names."""
