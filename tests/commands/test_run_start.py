"""``run --once``'s start against the embedded broker and the tests' Spark session: the broker's latest positions
are asked once on the driver, and both the nothing-new check and the progress's backlog read that one answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload import progress as progress_module
from streamoffload.cli import main
from streamoffload.commands import run as run_command
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.status import latest_positions
from streamoffload.streaming.job import session as session_module
from streamoffload.streaming.source.offset_planner import SourcePlanner
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import write_job_config


class KeptSession:
    """The tests' session as ``run`` sees it, except that ``run``'s ``stop`` at its end leaves it running."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def stop(self) -> None:
        pass


def test_run_once_asks_the_broker_for_the_latest_positions_once(
    spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic("start-lookups")
    produce(pulsar_broker.service_url, [topic], count=30, payload_size=64, batching=False)
    last = latest_positions(pulsar_broker.service_url, [topic])[topic]
    assert last is not None and last[1] == 29
    config_path = write_job_config(tmp_path, pulsar_broker.service_url, topics=[topic])
    asked: list[dict[str, Any]] = []
    ask = SourcePlanner.latest_positions

    def counted(self: SourcePlanner, partitions: Any) -> Any:
        answer = ask(self, partitions)
        asked.append(dict(answer))
        return answer

    backlogs: list[dict[str, int | None]] = []
    backlog_at_start = run_command.backlog_at_start

    def kept_backlog(job: Any, latest: Any) -> dict[str, int | None]:
        backlogs.append(backlog_at_start(job, latest))
        return backlogs[-1]

    monkeypatch.setattr(SourcePlanner, "latest_positions", counted)  # the query's planner runs in a Python worker
    # As on a terminal: the backlog is wanted.
    monkeypatch.setattr(progress_module, "progress_shown", lambda _stream=None: True)
    monkeypatch.setattr(run_command, "backlog_at_start", kept_backlog)
    monkeypatch.setattr(session_module, "build_session", lambda **_kw: KeptSession(spark))

    argv = ["run", "--once", "--conf", str(config_path), "--metrics-address", ""]
    assert main(argv) == 0
    assert asked == [{topic: last}]  # one lookup on the driver: the fast path's check and the progress share it
    # The store had nothing of it: counted from the broker, all 30 entries, and their bytes estimated from samples
    # (64-byte payloads with their metadata: more than the payloads, far less than 200 bytes an entry).
    (count,) = (backlog[topic] for backlog in backlogs)
    assert count is not None and count.entries == 30 and 30 * 64 < count.bytes < 30 * 200, count

    assert main(argv) == 0  # nothing new now: no Spark, and again one lookup
    assert asked == [{topic: last}, {topic: last}]
    assert len(backlogs) == 1  # and no count
