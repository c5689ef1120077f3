"""A fork server for the one-off Python processes Spark starts per query.

Besides the task workers (forked by the worker daemon, ``streaming/runtime/worker_daemon.py``), Spark starts
plain Python processes on the driver: one runner per streaming Python source per query start, data
source lookups and planners, transformWithState's driver-side runner. Each imported pyspark, pandas and
pyarrow from scratch: 0.65 to 0.8 CPU s apiece, about 2 CPU s of every ``run --once`` on this machine
(``bench/offload.py``'s process census, 2026-11-25). This server imports those modules once; Spark's
launcher (``streaming/runtime/worker_python.py``) hands each such process to it through
``streaming/runtime/fork_client.py``, and it forks a child with the imports done that runs the module as
``python -m`` would, with the client's stdin/stdout/stderr, environment, working directory and
arguments.

It is started by ``streaming.job.session.build_session`` for local masters, as a child of the driver, on a
Unix socket in a private directory (mode 0700). It exits when the driver does (``PR_SET_PDEATHSIG``, and
a check of its parent at start) or on SIGTERM. One thread, no clients or sockets but its own before a
fork: a forked child inherits nothing it could not use. When a client goes away before its child exits
(Spark stopped the process it started), the child gets SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from streamoffload.redaction import private_opener
from streamoffload.streaming.runtime.fork_client import SOCKET_ENV, STATUS

RUNNER_MODULES = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.streaming.transform_with_state_driver_worker",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner",
)
"""Spark's one-off driver-side modules: imported here so a child only runs them (``runpy`` runs a fresh
copy as ``__main__``; their imports are what costs)."""

_PR_SET_PDEATHSIG = 1
_MAX_REQUEST = 16 << 20


@dataclass
class _Client:
    conn: socket.socket
    pid: int = 0
    pidfd: int = -1
    gone: bool = False
    """The client went away (its connection is closed)."""
    reaped: bool = False
    """The child exited and was reaped: its pid is free for reuse."""


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the driver dies (Linux); exit now if it already has."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


_PR_SET_NAME = 15


def process_name(argv: list[str]) -> str:
    """What a child shows as its name (``/proc/PID/comm``, 15 bytes): the last module it was given, e.g.
    ``plan_data_sourc`` for ``-m pyspark.daemon pyspark.sql.worker.plan_data_source_read``. Its command
    line stays the server's, so tools that tell Spark's processes apart (``bench/procstats.py``) read this."""
    modules = [a for a in argv if a.startswith(("pyspark.", "streamoffload."))]
    return (modules[-1] if modules else argv[-1]).rsplit(".", 1)[-1][:15]


def _name_process(argv: list[str]) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(process_name(argv).encode()), 0, 0, 0)


def preload() -> None:
    from streamoffload.streaming.runtime.worker_daemon import PRELOADED
    from streamoffload.streaming.runtime.worker_daemon import preload as preload_modules

    preload_modules(PRELOADED + RUNNER_MODULES)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request and its three file descriptors (stdin, stdout, stderr)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        if len(data) > _MAX_REQUEST:
            raise ValueError("request too large")
        more = conn.recv(1 << 16)
        if not more:
            raise ValueError("request cut short")
        data += more
    (length,) = struct.unpack(">I", data[:4])
    return json.loads(data[4 : 4 + length]), fds


def _child(request: dict[str, Any], fds: list[int], servers: list[int]) -> None:
    """In the forked child: become the process the client would have started, run the module, exit.
    ``servers``: the server's own descriptors (its socket, selector, other clients' connections and
    children), closed first so that a long-lived child (a Spark daemon) holds none of them."""
    code = 1
    try:
        for fd in servers:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # Spark's PYTHONPATH entries (e.g. files shipped with the job) ahead of the server's own path.
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[:0] = extra
        argv = list(request["argv"])
        module = argv[1]
        _name_process(argv)
        sys.argv = [module, *argv[2:]]
        sys.modules.pop(module, None)  # runpy runs a fresh copy as __main__, with no warning about the old one
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF if code >= 0 else 1)


def _start_child(client: _Client, servers: list[int]) -> None:
    request, fds = _read_request(client.conn)
    argv = request.get("argv") or []
    if len(fds) != 3 or argv[:1] != ["-m"] or len(argv) < 2:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"unusable request: argv {argv[:2]}, {len(fds)} descriptors")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, fds, servers)
    for fd in fds:
        os.close(fd)
    client.pid = pid
    client.pidfd = os.pidfd_open(pid)


def _finish(selector: selectors.BaseSelector, client: _Client, status: int | None) -> None:
    if status is not None:
        with contextlib.suppress(OSError):
            client.conn.sendall(STATUS.pack(status))
    for sock_or_fd in (client.conn, client.pidfd):
        if sock_or_fd == -1:
            continue
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(sock_or_fd)
    client.conn.close()
    if client.pidfd != -1:
        os.close(client.pidfd)
        client.pidfd = -1


def _on_event(selector: selectors.BaseSelector, kind: str, client: _Client) -> None:
    """A child exited, or its client went away. Both can come in one ``select``: an event of a client that is
    finished already is stale (its pid may even belong to another process by now) and is ignored."""
    if client.reaped:
        return
    if kind == "exit":
        _pid, wait_status = os.waitpid(client.pid, 0)
        client.reaped = True
        _finish(selector, client, os.waitstatus_to_exitcode(wait_status))
    elif not client.gone:  # the client went away (Spark stopped it) before its child exited
        client.gone = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(client.pid, signal.SIGTERM)  # not reaped yet: the pid is still the child's
        selector.unregister(client.conn)
        client.conn.close()  # closed now: later children must not inherit it


def _server_fds(selector: selectors.BaseSelector) -> list[int]:
    """Every descriptor the server holds besides stdin, stdout and stderr: its selector's own, and what is
    registered in it (the listening socket, clients' connections, children's pidfds)."""
    fds = [key.fd for key in selector.get_map().values()]
    with contextlib.suppress(AttributeError, NotImplementedError):
        fds.append(selector.fileno())  # type: ignore[attr-defined]
    return fds


def serve(path: str, parent: int) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)
    listener.listen(64)
    os.replace(path + ".tmp", path)  # clients connect only once the imports are done
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    while True:
        for key, _events in selector.select():
            if key.data is None:
                try:
                    conn, _ = listener.accept()
                except OSError as exc:  # e.g. out of descriptors for a moment: the client falls back
                    print(f"streamoffload fork server: accept: {exc}", file=sys.stderr)
                    continue
                client = _Client(conn)
                try:
                    _start_child(client, [*_server_fds(selector), conn.fileno()])
                except (OSError, ValueError) as exc:
                    print(f"streamoffload fork server: {exc}", file=sys.stderr)
                    _finish(selector, client, 1)
                    continue
                selector.register(conn, selectors.EVENT_READ, ("conn", client))
                selector.register(client.pidfd, selectors.EVENT_READ, ("exit", client))
                continue
            try:
                _on_event(selector, *key.data)
            except Exception:  # one client's trouble must not end the server (Spark would fall back for good)
                traceback.print_exc()


class ForkServer:
    """The driver's handle on a running fork server: its socket path, and :meth:`stop`."""

    def __init__(self, process: subprocess.Popen[bytes], directory: str) -> None:
        self.process = process
        self.directory = directory
        self.path = os.path.join(directory, "fork.sock")

    def ready(self) -> bool:
        return os.path.exists(self.path) and self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_fork_server(*, wait_s: float = 0.0, log_path: str | None = None) -> ForkServer | None:
    """Start a fork server for this process. It imports while the JVM starts: with ``wait_s`` 0 this returns
    at once, and until the server listens Spark's processes start the ordinary way. Else waits up to
    ``wait_s`` seconds until it listens; None when it did not come up."""
    directory = tempfile.mkdtemp(prefix="streamoffload-fork-")  # mode 0700
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(SOCKET_ENV, None)
    stderr = open(log_path, "ab", opener=private_opener) if log_path else None  # noqa: SIM115 - handed to the child
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, os.path.join(directory, "fork.sock"), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            close_fds=True,
        )
    finally:
        if log_path:
            stderr.close()  # type: ignore[union-attr]
    server = ForkServer(process, directory)
    deadline = time.monotonic() + wait_s
    while wait_s > 0 and not server.ready():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            return None
        time.sleep(0.02)
    return server


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
