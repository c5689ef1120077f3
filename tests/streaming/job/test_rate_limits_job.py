"""Issue 26: the upload rate limit holds in the running job, a live policy edit changes it within the policy's
effective delay, and the read limit's waits in the source count in the throttle figures. Short on purpose (a few
MiB at 1 MiB/s, then at 256 KiB/s); the 30 s figure at 10 MB/s, window by window, is ``bench/rate_limit.py``'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.produce import produce
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.streaming.governance.rate_limits import READ_CHUNK
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.report import BatchReport
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import fs_store, poll, wait_for_policy, write_config

pytestmark = [pytest.mark.spark, pytest.mark.broker]

KIB = 1024
ENTRY = 8 * KIB
LIMITED = """
[offload]
managedLedgerOffloadMaxBlockSizeInBytes = 65536
maxOffloadSegmentRolloverTimeMinutes = 10
offloadUploadRateBytesPerSecond = "1MiB"
offloadReadRateBytesPerSecond = "2MiB"
"""


class Uploads:
    """Each micro-batch's part bytes and upload throttle (and read throttle), as the job reports them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        self.throttled = 0.0
        self.read_throttled = 0.0
        self.batches = 0

    def __call__(self, report: BatchReport) -> None:
        with self.lock:
            self.bytes += report.stats.part_bytes
            self.throttled += sum(kinds.get("upload", 0.0) for kinds in report.stats.throttled.values())
            self.read_throttled += sum(kinds.get("read", 0.0) for kinds in report.stats.throttled.values())
            self.batches += 1

    def snapshot(self) -> tuple[int, float]:
        with self.lock:
            return self.bytes, self.throttled


def test_upload_limit_holds_and_a_live_edit_changes_it(
    running_job: Callable[[Path], OffloadJob], pulsar_broker: Any, tmp_path: Path
) -> None:
    topic = unique_topic("rate")
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path), LIMITED).resolve()
    config_path.write_text(config_path.read_text().replace("max_message_size = 4096", "max_message_size = 16384"))
    uploads = Uploads()
    job = running_job(config_path)
    job.listeners.append(uploads)

    # 2 MiB at 1 MiB/s: the sink waits for most of 2 s, less the last part's booking (a debt the next part waits
    # out): parts of up to FilesystemStore.part_size (256 KiB) on a filesystem store.
    produce(pulsar_broker.service_url, topic, count=256, payload_size=ENTRY, batching=False)
    first = poll(lambda: (s := uploads.snapshot())[0] >= 256 * ENTRY and s, what="2 MiB uploaded")
    read_waited, batches = uploads.read_throttled, uploads.batches
    assert first[1] >= 0.7 * (first[0] - FilesystemStore.part_size) / (1 << 20), first  # throttled ~ bytes / rate
    # And at most bytes / rate, whatever the clock did: a bucket starts empty and hands out waits only for the
    # tokens its bookings lack, so the waits of B bytes at rate r add up to at most B / r (token_bucket.py; the
    # buckets of each Spark worker process count apart, each for its own bytes).
    assert first[1] <= first[0] / (1 << 20), first
    # The read limit (2 MiB/s) waits in Spark's source tasks, another process than the sink: their waits reach the
    # job's figures through the rows (read_wait_us) and the segmenter's stats (the sink reads nothing again: spool).
    assert read_waited >= 0.3 * first[0] / (2 << 20), (read_waited, first)
    # At most the bytes booked / rate: the entries (no more than the parts built of them) and, per range read (at
    # most one per micro-batch), a booking of up to READ_CHUNK left unused at its end.
    assert read_waited <= (first[0] + batches * READ_CHUNK) / (2 << 20), (read_waited, first, batches)

    # A live edit to 256 KiB/s: in force after the policy's effective delay (~1.2 s in these tests), then 1 MiB
    # takes about 4 s of waits, four times as long per byte as before (less one part's booking, as above).
    config_path.write_text(config_path.read_text().replace('"1MiB"', '"256KiB"'))
    wait_for_policy(job, '"offloadUploadRateBytesPerSecond": 262144')
    time.sleep(1.5)  # the executors' next listing of the versions (refresh 1 s) and their cached limits (1 s)
    started = time.monotonic()
    produce(pulsar_broker.service_url, topic, count=128, payload_size=ENTRY, batching=False)
    second = poll(lambda: (s := uploads.snapshot())[0] >= first[0] + 128 * ENTRY and s, what="1 MiB more uploaded")
    elapsed = time.monotonic() - started
    moved, waited = second[0] - first[0], second[1] - first[1]
    assert elapsed >= 0.9 * (moved - FilesystemStore.part_size) / (256 * KIB), (elapsed, moved)
    assert waited >= 0.7 * (moved - FilesystemStore.part_size) / (256 * KIB), (waited, moved)
    # At most moved / rate again: a bucket's debt from the first phase (at most a part less its burst) is paid
    # back at 1 MiB/s within 0.05 s, and the edit reaches a bucket (set_rate, which first refills at the old rate)
    # seconds after its last booking; bytes still booked at the old rate waited less.
    assert waited <= moved / (256 * KIB), (waited, moved)
