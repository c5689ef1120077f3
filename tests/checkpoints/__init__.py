"""Direct tests of ``checkpoints/``: plain Python on real stores (a filesystem store, moto S3), no Spark."""
