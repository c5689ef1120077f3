"""The root of the streaming job's errors (its stages, what they hand over, its runs): this layer's one base, so
``except StreamingError`` sees every one. An error that specialises a lower layer's (a fence is a
``FencedError``, an entry gone from the broker a ``DataLossError``) keeps that base instead."""

from __future__ import annotations

from streamoffload.errors import StreamOffloadError


class StreamingError(StreamOffloadError):
    """The offload job cannot go on as asked: a topic set aside, a replay that differs, a torn hand-over, ..."""
