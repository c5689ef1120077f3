"""The root of the Iceberg tables' errors: this layer's one base, so ``except TableError`` sees every one."""

from __future__ import annotations

from streamoffload.errors import StreamOffloadError


class TableError(StreamOffloadError):
    """A table that cannot be derived, synced or read from this store as it is."""
