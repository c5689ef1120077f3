"""Byte sizes and durations: their units and the one grammar of each, for the configuration file, the data
source options and the command line. A leaf every layer may import (like ``streamoffload.errors``).

Sizes: a number (digits, optionally a fraction: ``1.5``), then optionally a binary unit ``k``, ``m``, ``g`` or
``t`` (k = 1024, as in Pulsar's ``...Mbytes`` keys), then optionally ``i`` and ``b``; any letter case, spaces
allowed around the unit. ``1048576``, ``512b``, ``64k``, ``64KB``, ``64 KiB``, ``1.5g``, ``2TiB``.

Durations: one or more parts ``N unit``, ``N`` digits with an optional fraction, units ``ms``, ``s``, ``m`` (or
``min``), ``h`` and ``d``, summed: ``500ms``, ``90s``, ``10m``, ``4h``, ``2d``, ``1h30m``. Never negative."""

from __future__ import annotations

import re
from fractions import Fraction

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

SIZE_UNITS = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}
"""Bytes per size unit (the letter before the optional ``i`` and ``b``)."""
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
SIZE_EXAMPLES = "1048576, 64KiB, 64MiB or 1GiB"

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

DURATION_UNITS_MS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "min": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS}
"""Milliseconds per duration unit."""
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)", re.IGNORECASE)
_DURATION_RE = re.compile(rf"^\s*(?:{_DURATION_PART.pattern}\s*)+$", re.IGNORECASE)


def parse_size(text: str) -> Fraction:
    """The exact number of bytes ``text`` says (the module's size grammar); ``ValueError`` naming the text and
    examples otherwise. Exact, so that a whole number of bytes is known to be one."""
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"expected a size like {SIZE_EXAMPLES}, got {text!r}")
    return Fraction(match.group(1)) * SIZE_UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    """``size`` bytes (zero or more) in the size grammar, in the largest binary unit that holds it exactly
    (``64MiB``, ``1536KiB``, ``100``): ``parse_size(format_size(n)) == n``."""
    if size < 0:
        raise ValueError(f"a size is never negative, got {size}")
    for letter in "tgmk":
        unit = SIZE_UNITS[letter]
        if size and size % unit == 0:
            return f"{size // unit}{letter.upper()}iB"
    return str(size)


def parse_duration_ms(text: str) -> float:
    """Milliseconds in ``text`` (the module's duration grammar); ``ValueError`` for anything else (no sign:
    durations are never negative)."""
    if not isinstance(text, str) or not _DURATION_RE.match(text):
        raise ValueError(f"expected a duration like 90s, 10m, 4h, 2d or 500ms, got {text!r}")
    return float(sum(float(n) * DURATION_UNITS_MS[unit.lower()] for n, unit in _DURATION_PART.findall(text)))


def format_duration_ms(ms: int) -> str:
    """``ms`` milliseconds (zero or more) in the duration grammar, largest units first (``1h30m``, ``90s`` is
    ``1m30s``, ``0ms``): ``parse_duration_ms(format_duration_ms(n)) == n``."""
    if ms < 0:
        raise ValueError(f"a duration is never negative, got {ms}")
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        count, ms = divmod(ms, DURATION_UNITS_MS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0ms"
