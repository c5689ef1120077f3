"""The root of every error this project raises on purpose; a leaf module every layer may import."""

from __future__ import annotations


class StreamOffloadError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(StreamOffloadError):
    """Invalid configuration: names the key and the file it came from."""
