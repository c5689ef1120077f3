"""A stored entry's position: ``(ledger id, entry id)``, both Java longs, ordered as tuples order."""

from __future__ import annotations

Position = tuple[int, int]

# Ledger and entry ids are Java longs.
MAX_ID = 2**63 - 1
