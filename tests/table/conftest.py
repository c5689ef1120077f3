"""Fixtures of the table tests: the running job of the job tests (``tests/job/conftest.py``)."""

from tests.job.conftest import running_job

__all__ = ["running_job"]
