"""``read.segment.stored_block_reader.stored_layout``: a compressed segment's blocks are held to the block size
its policy recorded, before any frame is fetched or inflated (issue 52: decompression bounded at rest too)."""

from __future__ import annotations

import json
import uuid

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.block_frames import CODEC_NONE, CODEC_ZSTD, MAX_BLOCK, Frame, FrameError, encode_table
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.read.segment.stored_block_reader import stored_layout

TOPIC = "persistent://public/default/t-partition-0"


def _manifest(frames: list[Frame], policy: str | None) -> SegmentManifest:
    props = {mf.PROP_COMPRESSION: "zstd", mf.PROP_FRAMES: encode_table(frames)}
    if policy is not None:
        props[mf.PROP_POLICY] = policy
    return mf.new_manifest(
        topic=TOPIC,
        segment_id=uuid.UUID(int=7),
        ordinal=1,
        format_version=2,
        start=(3, 0),
        assigned_ms=1,
        data_key="public/default/t-partition-0/x",
        index_key="public/default/t-partition-0/x-index",
        driver_properties=props,
    )


BLOCKS = [BlockLocation(3, 0, 1, 0, 4096), BlockLocation(3, 10, 2, 4096, 8192)]


def test_a_compressed_block_longer_than_the_block_size_is_refused() -> None:
    frames = [Frame(CODEC_ZSTD, 100), Frame(CODEC_ZSTD, 200)]
    policy = json.dumps({"managedLedgerOffloadMaxBlockSizeInBytes": 4096})
    with pytest.raises(FrameError) as info:
        stored_layout(_manifest(frames, policy), BLOCKS)
    assert info.value.reason == (
        "block 2 at plaintext offset 4096 is compressed and its index says it holds 8192 bytes, above the "
        "segment's 4096-byte block size"
    )
    # Stored as it is, a block costs what is stored: nothing to bound.
    layout = stored_layout(_manifest([Frame(CODEC_ZSTD, 100), Frame(CODEC_NONE, 8192)], policy), BLOCKS)
    assert layout is not None and layout.block_size == 4096 and layout.size == 8292


@pytest.mark.parametrize(
    "policy", [None, "not json", "[1]", json.dumps({"managedLedgerOffloadMaxBlockSizeInBytes": "x"})]
)
def test_without_a_readable_block_size_the_bound_is_pulsars_int(policy: str | None) -> None:
    layout = stored_layout(_manifest([Frame(CODEC_ZSTD, 100), Frame(CODEC_ZSTD, 200)], policy), BLOCKS)
    assert layout is not None and layout.block_size == MAX_BLOCK
    assert [(b.plain_length, b.stored_offset, b.stored_length) for b in layout.blocks] == [
        (4096, 0, 100),
        (8192, 100, 200),
    ]
