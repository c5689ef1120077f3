# Root conftest: shared fixtures live in one module per resource so separate work never collides.
pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.broker",
    "tests.fixtures.pulsar",
    "tests.fixtures.s3",
    "tests.fixtures.s3rver",
    "tests.fixtures.postgres",
    "tests.fixtures.iceberg_rest",
    "tests.fixtures.job",
]
