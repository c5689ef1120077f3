"""A real S3 endpoint on this machine: ``moto_server`` on a free loopback port, and a plain botocore client on it.

The benches start it themselves (bench/ceiling.py, bench/read.py, bench/harness.py's ``moto_bucket``, bench/
pulsar_offloader.py); the suite's fixtures (tests/fixtures/s3.py) wrap the same starter in a session fixture.
moto takes any credentials: :data:`S3_CREDENTIALS` are dummies. Needs ``moto[server]`` (the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict


class S3Credentials(TypedDict):
    """``S3Store``'s credential keywords, so that ``S3Store(..., **S3_CREDENTIALS)`` is type-checked."""

    access_key: str
    secret_key: str


S3_CREDENTIALS: S3Credentials = {"access_key": "testing", "secret_key": "testing"}
S3_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status)
    except urllib.error.HTTPError:
        return True  # any HTTP answer means it is serving
    except OSError:
        return False


def moto_command() -> list[str] | None:
    """How to start moto's S3 server from this interpreter, or None when moto[server] is not installed."""
    executable = Path(sys.executable).parent / "moto_server"
    if executable.exists():
        return [str(executable)]
    if importlib.util.find_spec("moto.server") is not None:
        # A venv that sees moto through another environment's site-packages has no moto_server script.
        return [sys.executable, "-m", "moto.server"]
    return None


@contextlib.contextmanager
def moto_endpoint(log_path: Path) -> Iterator[str]:
    """A ``moto_server`` on a free loopback port, answering, for as long as the block runs: its URL. Its output
    goes to ``log_path``; RuntimeError (naming the log) when it is not installed or does not start."""
    command = moto_command()
    if command is None:
        raise RuntimeError(f"moto_server not found beside {sys.executable} (pip install 'moto[server]')")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    for _ in range(3):  # the free port can be taken between probing and binding: try another
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [*command, "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, so teardown stops it and its children
            )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not _answers(url + "/"):
            time.sleep(0.05)
        if proc.poll() is None and _answers(url + "/"):
            break
        stop_server(proc)
    else:
        raise RuntimeError(
            f"moto_server did not start; see {log_path}:\n{log_path.read_text(errors='replace')[-2000:]}"
        )
    try:
        yield url
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def raw_s3_client(endpoint_url: str, credentials: S3Credentials = S3_CREDENTIALS) -> Any:
    """A plain synchronous botocore client on the endpoint, for setup and for looking behind a store."""
    import botocore.session
    from botocore.config import Config

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=S3_REGION,
        aws_access_key_id=credentials["access_key"],
        aws_secret_access_key=credentials["secret_key"],
        config=Config(s3={"addressing_style": "path"}),
    )
