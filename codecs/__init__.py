"""Pure byte codecs: PIP-17 (v1) and PIP-76 (v2) data blocks and index objects, Pulsar entries and their
payload compression, the blocks' compression and encryption at rest, recorded checksums, the checksum frame of
our own objects, topic names, positions and the protobuf metadata messages. No I/O happens here; everything
works on bytes and memoryviews."""
