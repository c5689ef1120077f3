"""The Spark data sources: the live ``pulsar`` source (its options, offset planning, admission, backlog and
input partitions), the job's ``offload-now`` control source and the ``pulsar-offloaded`` dataset reader."""
