"""Text from a store, a broker or a file, made safe to print on a terminal: ``printable`` escapes control
characters (an ESC that would recolour or clear the screen, a carriage return that would overwrite a line, a
newline that would forge one) and the bidirectional-text controls that reorder what is shown. The one helper for
what the command line prints (tables, summaries, error lines, log lines on the terminal); JSON output needs
none (JSON escapes them). A leaf module: every layer may import it."""

from __future__ import annotations

import re
from typing import TextIO

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with each control character written as Python writes it in a string (``\\x1b``, ``\\r``,
    ``\\n``, ``\\u202e``); ``keep_newlines``: line breaks stay (multi-line text such as a table)."""
    if keep_newlines:
        return "\n".join(_UNPRINTABLE.sub(_escape, line) for line in text.split("\n"))
    return _UNPRINTABLE.sub(_escape, text)


class PrintableWriter:
    """A text stream that writes what it is given through ``printable`` (line breaks kept): for commands whose
    output mixes their own lines with names and messages read from the store."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text, keep_newlines=True))

    def flush(self) -> None:
        self.stream.flush()


__all__ = ["PrintableWriter", "printable"]
