"""bench/s3_fault_proxy.py in front of a real moto_server: it passes S3 traffic through untouched (put, get,
ranged get, head, multipart), and each fault reaches the project's S3 client as that fault would from S3."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.s3_fault_proxy import Fault, S3FaultProxy
from streamoffload.storage.base import StorageError
from streamoffload.storage.s3 import S3Store

pytestmark = [pytest.mark.s3]


@pytest.fixture
def proxy(moto_server: str) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(moto_server, seed=3) as proxy:
        yield proxy


def _store(proxy: S3FaultProxy, bucket: str, s3_settings: dict[str, Any], **options: Any) -> S3Store:
    settings = {**s3_settings, "endpoint_url": proxy.url, "retry_base_delay": 0.01, "retry_max_delay": 0.05}
    return S3Store(bucket, **{**settings, **options})


def test_without_faults_s3_traffic_passes_through_unchanged(
    proxy: S3FaultProxy, s3_bucket: str, s3_settings: dict[str, Any]
) -> None:
    store = _store(proxy, s3_bucket, s3_settings)
    try:
        store.put("a/b", b"x" * 1000, metadata={"k": "v"})
        assert store.get("a/b") == b"x" * 1000
        assert store.get_range("a/b", 10, 5) == b"xxxxx"
        assert store.head("a/b").size == 1000
        upload = store.start_multipart("big")
        part = bytes(range(256)) * (5 * 1024 * 1024 // 256)
        upload.write_part(1, part)
        upload.write_part(2, b"tail")
        upload.complete([1, 2])
        assert store.get("big") == part + b"tail"
        assert [o.key for o in store.list("a/")] == ["a/b"]
    finally:
        store.close()
    assert proxy.requests > 0 and not proxy.injected


@pytest.mark.parametrize("kind", ["500", "503", "reset"])
def test_every_request_failing_ends_in_a_storage_error_after_the_clients_retries(
    kind: str, proxy: S3FaultProxy, s3_bucket: str, s3_settings: dict[str, Any]
) -> None:
    store = _store(proxy, s3_bucket, s3_settings, max_attempts=3)
    try:
        proxy.set_fault(Fault(kind))
        with pytest.raises(StorageError):
            store.put("k", b"v")
        assert proxy.injected[kind] >= 3  # the client retried each answer as retryable
        proxy.clear()
        store.put("k", b"v")  # and the same client works again once the fault is gone
        assert store.get("k") == b"v"
    finally:
        store.close()


def test_a_share_of_requests_failing_is_ridden_out_by_retries(
    proxy: S3FaultProxy, s3_bucket: str, s3_settings: dict[str, Any]
) -> None:
    store = _store(proxy, s3_bucket, s3_settings, max_attempts=8)
    try:
        proxy.set_fault(Fault("503", share=0.5))
        for n in range(10):
            store.put(f"k{n}", str(n).encode())
        assert [store.get(f"k{n}") for n in range(10)] == [str(n).encode() for n in range(10)]
        assert proxy.injected["503"] > 0
    finally:
        store.close()


def test_a_hang_times_the_client_out_and_a_delay_only_slows_it(
    proxy: S3FaultProxy, s3_bucket: str, s3_settings: dict[str, Any]
) -> None:
    store = _store(proxy, s3_bucket, s3_settings, max_attempts=1, read_timeout=0.5)
    try:
        store.put("k", b"v")
        proxy.set_fault(Fault("hang", hang_s=30))
        started = time.monotonic()
        with pytest.raises(StorageError):
            store.get("k")
        assert time.monotonic() - started < 10  # the client's read timeout, not the proxy's hang
        proxy.set_fault(Fault("delay", delay_s=0.3))
        store_patient = _store(proxy, s3_bucket, s3_settings, max_attempts=1, read_timeout=5)
        try:
            started = time.monotonic()
            assert store_patient.get("k") == b"v"
            assert time.monotonic() - started >= 0.3
        finally:
            store_patient.close()
        proxy.clear()  # also resets the connection still hanging
    finally:
        store.close()
