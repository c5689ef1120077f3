"""Offload metadata (OffloadContext / OffloadSegment per topic-partition), kept in the same store as
the data and always written last."""
