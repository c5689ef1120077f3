"""The segmenter: seals segments, cuts blocks and parts from entry positions (``segmenter``, its state in
``segmenter_model``), run by Spark's ``transformWithState`` (``segmenter_spark``)."""
