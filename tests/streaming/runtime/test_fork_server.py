"""The fork server for Spark's one-off driver-side Python processes (streaming/runtime/fork_server.py), reached
through the workers' launcher (streaming/runtime/worker_python.py) and its client (streaming/runtime/fork_client.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.streaming.job import session
from streamoffload.streaming.runtime.fork_client import SOCKET_ENV
from streamoffload.streaming.runtime.fork_server import ForkServer, start_fork_server
from streamoffload.streaming.runtime.worker_python import worker_python

MODULE = """\
import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "greeting", os.environ.get("GREETING"))
print("preloaded", "pandas" in sys.modules and "pyspark.sql" in sys.modules, "parent", os.getppid())
fds = os.listdir("/proc/self/fd")  # stdin, stdout, stderr and the listing's own
print("descriptors", len(fds) - 1)
sys.stderr.write("a line on stderr\\n")
sys.stdout.flush()
if os.environ.get("PID_FILE"):
    with open(os.environ["PID_FILE"], "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(120)
if os.environ.get("KILL_SELF"):
    os.kill(os.getpid(), 9)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    started = start_fork_server(wait_s=60)
    assert started is not None, "the fork server did not come up"
    yield started
    started.stop()


@pytest.fixture
def launch(tmp_path: Path, server: ForkServer) -> Any:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "forkee.py").write_text(MODULE)
    launcher = worker_python(str(tmp_path / "launchers"))

    def run(*args: str, socket_path: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            SOCKET_ENV: server.path if socket_path is None else socket_path,
            "PYTHONPATH": str(tmp_path / "mods"),
            **env,
        }
        return subprocess.run([launcher, *args], env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    return run


def test_a_module_runs_in_a_child_of_the_server_with_the_callers_arguments_environment_and_files(
    launch: Any, server: ForkServer, tmp_path: Path
) -> None:
    result = launch("-m", "forkee", "a", "b c", GREETING="hello", EXIT_CODE="3")
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == [
        f"argv ['a', 'b c'] cwd {tmp_path} greeting hello",
        f"preloaded True parent {server.process.pid}",
        "descriptors 3",  # none of the server's: its socket, selector, other clients' connections
    ]
    assert result.stderr == "a line on stderr\n"


def test_without_a_server_the_module_runs_the_ordinary_way(launch: Any, tmp_path: Path) -> None:
    result = launch("-m", "forkee", "x", socket_path=str(tmp_path / "gone.sock"), EXIT_CODE="4")
    assert result.returncode == 4
    first, second, _descriptors = result.stdout.splitlines()
    assert first == f"argv ['x'] cwd {tmp_path} greeting None"
    assert second.startswith("preloaded False parent ")  # a fresh interpreter imported nothing


def test_a_child_ended_by_a_signal_ends_its_caller_like_a_shell_says(launch: Any) -> None:
    assert launch("-m", "forkee", KILL_SELF="1").returncode == 128 + signal.SIGKILL


def test_stopping_the_caller_stops_its_child(tmp_path: Path, server: ForkServer) -> None:
    """Spark stops a process it started by signalling it: the child the server forked for it goes too."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "forkee.py").write_text(MODULE)
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, SOCKET_ENV: server.path, "PYTHONPATH": str(tmp_path / "mods"), "PID_FILE": str(pid_file)}
    caller = subprocess.Popen(
        [worker_python(str(tmp_path / "launchers")), "-m", "forkee"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and caller.poll() is None
        time.sleep(0.02)
    child = int(pid_file.read_text())
    assert child != caller.pid
    # Another child forked meanwhile holds nothing of the server's, not the first caller's connection.
    other = subprocess.run(
        [worker_python(str(tmp_path / "launchers")), "-m", "forkee"],
        env={k: v for k, v in env.items() if k != "PID_FILE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.stdout.splitlines()[-1] == "descriptors 3"
    caller.terminate()
    caller.wait(10)
    while os.path.exists(f"/proc/{child}") and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the child outlived its caller"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_anything_but_a_module_starts_the_ordinary_way(launch: Any, server: ForkServer) -> None:
    result = launch("-c", "import os, sys; print(os.getppid(), 'pandas' in sys.modules)")
    assert result.stdout.split()[1] == "False"
    assert int(result.stdout.split()[0]) != server.process.pid


def test_the_server_goes_when_its_driver_does(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from streamoffload.streaming.runtime.fork_server import start_fork_server as s; "
            "server = s(wait_s=60); print(server.process.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    server_pid = int(driver.stdout.readline())
    driver.kill()  # SIGKILL: no atexit, no stop(); the kernel tells the server (PR_SET_PDEATHSIG)
    driver.wait()
    deadline = time.monotonic() + 30
    while _state(server_pid) not in ("gone", "Z"):
        assert time.monotonic() < deadline, "the fork server outlived its driver"
        time.sleep(0.05)


def test_sparks_driver_side_runners_come_from_the_fork_server(spark: Any) -> None:
    """A Python data source's planning runs in a process that a Spark daemon on the driver forks: the daemon
    is a child of the session's fork server, so the planner starts with pandas already imported."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class WhereReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            import os
            import sys

            with open(f"/proc/{os.getppid()}/stat") as fh:  # the daemon's parent
                grandparent = int(fh.read().rsplit(")", 1)[1].split()[1])
            return [InputPartition((grandparent, "pandas" in sys.modules))]

        def read(self, partition: InputPartition) -> Iterator[tuple[int, bool]]:
            yield partition.value

    class WhereSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "streamoffload-test-where"

        def schema(self) -> str:
            return "grandparent long, preloaded boolean"

        def reader(self, schema: Any) -> DataSourceReader:
            return WhereReader()

    server = session._fork_server
    assert server is not None and os.environ.get(SOCKET_ENV) == server.path
    spark.dataSource.register(WhereSource)
    (row,) = spark.read.format("streamoffload-test-where").load().collect()
    assert (row.grandparent, row.preloaded) == (server.process.pid, True)


def test_an_event_of_a_finished_client_is_ignored() -> None:
    """A child's exit and its client's going away can come in one ``select``: once the child is reaped, the
    client's event is stale (the pid may be another process's by then) and must neither signal nor fail."""
    import selectors
    import socket

    from streamoffload.streaming.runtime.fork_server import _Client, _on_event

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ours, theirs = socket.socketpair()
    client = _Client(ours, pid=child.pid, pidfd=os.pidfd_open(child.pid))
    selector = selectors.DefaultSelector()
    selector.register(ours, selectors.EVENT_READ, ("conn", client))
    selector.register(client.pidfd, selectors.EVENT_READ, ("exit", client))
    ready = {key.data[0] for key, _ in selector.select(timeout=30)}
    deadline = time.monotonic() + 30
    while ready != {"exit"} and time.monotonic() < deadline:
        ready |= {key.data[0] for key, _ in selector.select(timeout=1)}
    theirs.close()  # now both are ready, as when Spark stops a client whose child just ended
    _on_event(selector, "exit", client)
    _on_event(selector, "conn", client)
    assert client.reaped and ours.fileno() == -1 and not selector.get_map()
    child.returncode = 0  # reaped by the server's waitpid, not by Popen
