"""The processes a chaos run drives: a producer thread publishing steady traffic it can account for, and
the job as a subprocess in its own process group, to be SIGKILLed whole (bench/chaos.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamoffload.produce import expected_payload
from streamoffload.streaming.runtime.faults import group_alive

# pulsar-client logs every producer's life at INFO; the harness's own lines should stand out.
_QUIET = logging.getLogger("bench.chaos.pulsar")
_QUIET.setLevel(logging.WARNING)


# --- traffic --------------------------------------------------------------------------------------------


@dataclass
class _TopicTraffic:
    batched: bool
    sent: int = 0
    acked: set[int] = field(default_factory=set)
    last_id: tuple[int, int] | None = None
    failures: int = 0


class Producer:
    """A thread publishing steadily to every topic-partition, round robin, at ``rate`` messages/s in all.

    Message ``seq`` of topic-partition ``t`` carries ``expected_payload(t, seq, payload_size)``. The
    broker's acknowledgements are recorded per topic-partition (sequence numbers and the last message id).
    ``compression``: a topic-partition's producer compression (``pulsar.CompressionType`` name, e.g. ``LZ4``,
    ``ZSTD``); the others publish uncompressed.

    ``active`` (bench/scale.py): each round publishes one message to each topic-partition it returns (asked again
    every round; a subset of ``topics``), instead of to all of them. A topic-partition's producer is then created
    when it becomes active and flushed and closed when it stops being active, so thousands of mostly idle
    topic-partitions do not hold a producer each.
    """

    def __init__(
        self,
        service_url: str,
        topics: dict[str, bool],
        rate: float,
        payload_size: int,
        *,
        compression: dict[str, str] | None = None,
        active: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.service_url = service_url
        self.active = active
        self.compression = compression or {}
        self.traffic = {t: _TopicTraffic(batched) for t, batched in topics.items()}
        self.rate = rate
        self.payload_size = payload_size
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> Producer:
        self._thread.start()
        self._ready.wait(60)
        if self.error is not None:
            raise RuntimeError(f"the producer failed to start: {self.error}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        if self.error is not None:
            raise RuntimeError(f"the producer failed: {self.error}")

    def _run(self) -> None:
        import pulsar

        producers: dict[str, Any] = {}
        try:
            client = pulsar.Client(self.service_url, logger=_QUIET)
            if self.active is None:
                producers = {t: self._create(client, t) for t in self.traffic}
        except BaseException as err:  # reported by start()
            self.error = err
            self._ready.set()
            return
        self._ready.set()
        started = time.monotonic()
        sent = 0
        try:
            while not self._stop.is_set():
                topics = list(self.traffic) if self.active is None else self._activate(client, producers)
                if not topics:  # nothing active: the pacing starts again with the next round
                    started, sent = time.monotonic(), 0
                    self._stop.wait(0.05)
                    continue
                for topic in topics:
                    tr = self.traffic[topic]
                    seq = tr.sent
                    tr.sent += 1
                    producers[topic].send_async(
                        expected_payload(topic, seq, self.payload_size),
                        self._callback(topic, seq),
                        properties={"seq": str(seq)},
                    )
                    sent += 1
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._stop.wait(ahead)
            for producer in producers.values():
                producer.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.pending() > 0:
                time.sleep(0.01)
        except BaseException as err:  # reported by stop()
            self.error = err
        finally:
            for producer in producers.values():
                with contextlib.suppress(Exception):
                    producer.close()
            client.close()

    def _create(self, client: Any, topic: str) -> Any:
        import pulsar

        return client.create_producer(
            topic,
            batching_enabled=self.traffic[topic].batched,
            batching_max_messages=20,
            batching_max_publish_delay_ms=20,
            max_pending_messages=10_000,
            block_if_queue_full=True,
            send_timeout_millis=60_000,
            compression_type=getattr(pulsar.CompressionType, self.compression.get(topic, "NONE")),
        )

    def _activate(self, client: Any, producers: dict[str, Any]) -> list[str]:
        """With ``active``: this round's topic-partitions, their producers created; the producers of those that
        stopped being active flushed and closed."""
        assert self.active is not None
        topics = list(dict.fromkeys(self.active()))
        wanted = set(topics)
        for topic in [t for t in producers if t not in wanted]:
            producer = producers.pop(topic)
            producer.flush()
            producer.close()
        for topic in topics:
            if topic not in producers:
                producers[topic] = self._create(client, topic)
        return topics

    def _callback(self, topic: str, seq: int) -> Callable[[Any, Any], None]:
        import pulsar

        def done(result: Any, msg_id: Any) -> None:
            with self._lock:
                tr = self.traffic[topic]
                if result != pulsar.Result.Ok:
                    tr.failures += 1
                    return
                tr.acked.add(seq)
                pos = (msg_id.ledger_id(), msg_id.entry_id())
                if tr.last_id is None or pos > tr.last_id:
                    tr.last_id = pos

        return done

    def pending(self) -> int:
        with self._lock:
            return sum(tr.sent - len(tr.acked) - tr.failures for tr in self.traffic.values())

    def acked_total(self) -> int:
        with self._lock:
            return sum(len(tr.acked) for tr in self.traffic.values())


# --- the job process ------------------------------------------------------------------------------------


class JobProcess:
    """One run of ``python -m streamoffload run --conf FILE``, in its own session (process group)."""

    def __init__(self, conf: Path, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.started_wall = time.time()
        self.started = time.monotonic()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamoffload", "run", "--conf", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=log_path.parent,  # not the caller's directory: ``-m streamoffload`` must import what env says
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group and wait until none of it is left (bounded)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def terminate(self, timeout: float = 90.0) -> int | None:
        """SIGTERM to the job (it stops after the current micro-batch), then SIGKILL the group if needed."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        code = self.proc.poll()
        self.kill()  # whatever of the group is left (Python workers, the JVM)
        return code

    def last_line(self) -> str:
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(empty log)"


# The last line of a traceback ("pkg.SomeError: why"), the job's own error log lines, the CLI's error line.
_ERROR_LINE = re.compile(r"^([\w.]*(Error|Exception): |\S+ \S+ ERROR streamoffload|streamoffload \w+: error: )")


def job_errors(log_dir: Path) -> list[str]:
    seen: dict[str, None] = {}
    for path in sorted(log_dir.glob("job-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if _ERROR_LINE.match(line):
                # Timestamps differ from run to run: keep the message's text once.
                text = re.sub(r"^\d\S+ \S+ ", "", line.strip())[:300]
                seen.setdefault(text, None)
    return list(seen)


# --- configuration --------------------------------------------------------------------------------------
