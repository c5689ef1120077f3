"""What writing new file pages costs this machine's kernel, and how much that cost moves: the floor under
every "CPU s per GB" figure of a job that writes what it offloads (bench/README, issue 22 session 24).

Run from the repository root:

    .venv/bin/python bench/page_cost.py                # 8 rounds of 256 MiB into a new file each
    .venv/bin/python bench/page_cost.py --mb 1024 --rounds 5 --dir /tmp

Each round writes ``--mb`` MiB into a new file under ``--dir`` (default ``var/``, the filesystem the demo's
store uses) with 4 MiB ``pwritev`` calls, then fsyncs and deletes it, and prints the thread CPU seconds the
writes took, per GiB. The same calls on the same buffer have measured 0.3 to 2.6 CPU s per GiB here,
depending on what the memory they land in last held (on a virtual machine a guest page the host has not
backed yet costs an exit to the host when it is first touched), so compare job CPU figures only within one
run and read them as a range, not to a tenth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

MIB = 1 << 20


def write_round(directory: str, mib: int, buffers: list[bytes]) -> float:
    """CPU seconds (this thread) to write ``mib`` MiB into a new file with 4 MiB pwritev calls."""
    fd, path = tempfile.mkstemp(dir=directory, prefix="page-cost-")
    try:
        offset = 0
        spent = 0.0
        for _ in range(mib // 4):
            started = time.thread_time()
            offset += os.pwritev(fd, buffers, offset)
            spent += time.thread_time() - started
        os.fsync(fd)
        return spent
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="MiB per round, a multiple of 4 (default 256)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    parser.add_argument("--dir", default="var", help="where the files go (default var/)")
    args = parser.parse_args()
    if args.mb < 4 or args.mb % 4:
        parser.error("--mb must be a multiple of 4")
    os.makedirs(args.dir, exist_ok=True)
    chunk = os.urandom(128 * 1024)
    buffers = [chunk] * 32  # 4 MiB of 128 KiB entries, as the sink hands a block to the store
    per_gib = []
    for n in range(1, args.rounds + 1):
        spent = write_round(args.dir, args.mb, buffers)
        per_gib.append(spent * 1024 / args.mb)
        print(f"round {n}: {spent:.2f} CPU s for {args.mb} MiB = {per_gib[-1]:.2f} CPU s per GiB")
    print(
        f"new-page writes: median {statistics.median(per_gib):.2f} CPU s per GiB, "
        f"min {min(per_gib):.2f}, max {max(per_gib):.2f} over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
