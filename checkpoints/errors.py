"""The root of the offload metadata's errors (leases, commits, cleanup, keys, control requests, adoption): this
layer's one base, so ``except CheckpointError`` sees every one. Malformed bytes stay the codecs' ``FormatError``s
and a bad setting a ``ConfigError``, whichever layer finds them."""

from __future__ import annotations

from streamoffload.errors import StreamOffloadError


class CheckpointError(StreamOffloadError):
    """Offload metadata that cannot be read, written or acted on as asked (other than malformed bytes)."""
