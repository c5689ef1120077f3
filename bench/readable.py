"""When published messages became readable in the store: what the offload and soak benches call lag.

A message is readable once its segment's manifest is ``Offloaded`` (readers read only those, and the manifest
is written last), so its lag is that manifest's last write time minus the publish time in the message's
metadata (set by the producer). Shared by bench/offload.py and bench/soak.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import iter_blocks
from streamoffload.codecs.entry import EntryMessage, entry_messages
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage.base import ObjectStore


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def offloaded_through(meta: MetadataStore, topic: str) -> tuple[int, int] | None:
    """The last position of the topic-partition's last Offloaded segment (None: nothing offloaded)."""
    segments = meta.offloaded_segments(topic)
    return mf.end_position(segments[-1]) if segments else None


def wait_offloaded(meta: MetadataStore, last: dict[str, tuple[int, int]], timeout: float) -> None:
    """Wait until every topic-partition's Offloaded segments reach its position in ``last``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((offloaded_through(meta, t) or (-1, -1)) >= pos for t, pos in last.items()):
            return
        time.sleep(0.5)
    behind = {t: offloaded_through(meta, t) for t, pos in last.items()}
    raise RuntimeError(f"not everything offloaded after {timeout:.0f} s: offloaded through {behind}, want {last}")


def readable_messages(
    store: ObjectStore, meta: MetadataStore, topic: str
) -> Iterator[tuple[SegmentManifest, float, EntryMessage]]:
    """Every message of the topic-partition's Offloaded segments, in order, with its segment and the time (epoch
    seconds) it became readable: the manifest's last write (whole-object reads, codecs only)."""
    for manifest in meta.offloaded_segments(topic):
        readable = store.head(meta.manifest_key(manifest)).last_modified
        for block in iter_blocks(store.get(manifest.dataKey)):
            for entry in block.entries:
                for message in entry_messages(entry.payload, verify_checksum=False):
                    yield manifest, readable, message
