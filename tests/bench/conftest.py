"""``--slow-benches``: run the benches that start Spark, a converging job or Apache Pulsar at their smoke size
(about 14 minutes on 2 loaded cores, so not in the default suite, which runs their ``--help`` instead)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-benches",
        action="store_true",
        help="also run the Spark and Apache Pulsar benches at their smoke size (tests/bench/test_bench_runs.py)",
    )
