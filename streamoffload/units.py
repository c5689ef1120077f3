"""Byte units, a leaf every layer may import (like ``streamoffload.errors``)."""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
