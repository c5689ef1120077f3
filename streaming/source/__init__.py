"""The Spark data sources: the live ``pulsar`` source (its options, offset planning, admission, backlog and
input partitions), the values of every data source option (``option_values``), the job's ``offload-now``
control source and the ``pulsar-offloaded`` dataset reader."""
