"""What the benches that drive a job process share on their command line: the store to use, where the work
directory goes and whether to keep it, and unwinding cleanly on SIGTERM (bench/soak.py; bench/chaos.py does
the same inline)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path


def add_work_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store fs|s3``, ``--work-dir DIR`` and ``--keep``."""
    parser.add_argument("--store", choices=["fs", "s3"], default="fs", help="filesystem, or S3 on a local moto_server")
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (job logs under logs/)")


def new_work_dir(parent: str | None, prefix: str) -> Path:
    """A fresh temporary work directory (under ``parent`` when given). From now on SIGTERM unwinds through the
    caller's ``finally`` blocks, which stop the job, the producer and the broker."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    if parent:
        os.makedirs(parent, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
