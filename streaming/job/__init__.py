"""The offload job: its run lifecycle (lease, recovery, checkpoint), the queries it builds, the supervision of
``run`` and ``run --once``, its health record, and the SparkSession it runs in (which registers every source)."""
