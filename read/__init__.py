"""Reading the store back, above the metadata it reads: one segment by position (``segment/``), a
topic-partition across its segments (``topic_reader``), the offloaded topics as a dataset without Spark
(``dataset_plan``: which segments and blocks; ``dataset_read``: their rows), a topic-partition read from the
store and then the broker (``through``, over the Pulsar client ``streamoffload.pulsar``), the entry at a publish
time in either (``starting_time``), and ``verify``'s checker (``verify/``). The ``pulsar-offloaded`` Spark source
(``streaming/source/offloaded_source.py``) is a thin layer over the dataset modules."""
