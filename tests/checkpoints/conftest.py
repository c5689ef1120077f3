"""A real store per test: a filesystem store in ``tmp_path``, or a bucket on the session's moto S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore


@pytest.fixture(params=["filesystem", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "filesystem":
        return FilesystemStore(tmp_path)
    s3: ObjectStore = request.getfixturevalue("s3_store")
    return s3


@pytest.fixture
def fs_store(tmp_path: Path) -> FilesystemStore:
    return FilesystemStore(tmp_path)
