"""Spark Structured Streaming pieces: the Pulsar source, the segmenter, the sink and the job. Spark
code is kept thin over plain Python that tests can call without Spark."""
