"""Run ``python -m MODULE ...`` as a child of the fork server (``streaming/runtime/fork_server.py``), or plainly.

Spark's launcher (``streaming/runtime/worker_python.py``) runs this file with ``python -I -S`` for the one-off
Python processes Spark starts per query (streaming source runners, data source planners,
transformWithState's driver-side runner): a bare interpreter starts in milliseconds, and it asks the
fork server, whose socket ``STREAMOFFLOAD_FORK_SERVER`` names, to fork a child that already imported
pyspark, pandas and pyarrow. The child gets this process's stdin, stdout and stderr (passed as file
descriptors), environment, working directory and arguments, so to Spark it looks like the process it
started. This process waits for the child and exits with its status; when Spark stops this process
(SIGTERM, SIGKILL), the server sees the connection close and stops the child.

When the server cannot be reached, the module runs here, by ``exec`` of the interpreter with the same
arguments: slower, never wrong. Standard library only, and nothing of streamoffload: ``-I -S`` keeps
the path empty of site-packages.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

SOCKET_ENV = "STREAMOFFLOAD_FORK_SERVER"
"""The environment variable naming the fork server's Unix socket."""

STATUS = struct.Struct(">i")
"""The server's answer: the child's exit status (a negative number is the signal that ended it)."""


def request(argv: list[str], env: dict[str, str], cwd: str) -> bytes:
    """The request: a 4-byte length, then JSON (the child's argv after the interpreter, environment, cwd)."""
    body = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
    return struct.pack(">I", len(body)) + body


def _run_plainly(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _exit_status(sock: socket.socket) -> int | None:
    data = b""
    while len(data) < STATUS.size:
        chunk = sock.recv(STATUS.size - len(data))
        if not chunk:
            return None
        data += chunk
    return int(STATUS.unpack(data)[0])


def main(argv: list[str]) -> None:
    path = os.environ.get(SOCKET_ENV, "")
    if not path or argv[:1] != ["-m"]:
        _run_plainly(argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        socket.send_fds(sock, [request(argv, dict(os.environ), os.getcwd())], [0, 1, 2])
    except OSError:
        sock.close()
        _run_plainly(argv)  # the server is gone (its driver stopped) or refuses: run the module here
    status = _exit_status(sock)
    if status is None:
        sys.stderr.write("streamoffload fork server: connection lost before the child exited\n")
        os._exit(1)
    os._exit(status if status >= 0 else 128 - status)


if __name__ == "__main__":
    main(sys.argv[1:])
