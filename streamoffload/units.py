"""Byte units, a leaf every layer may import (like ``streamoffload.errors``)."""

from __future__ import annotations

MIB = 1024 * 1024
