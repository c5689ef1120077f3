"""Pure byte codecs: PIP-17 (v1) and PIP-76 (v2) data blocks and index objects, Pulsar entries and
the protobuf metadata messages. No I/O happens here; everything works on bytes and memoryviews."""
