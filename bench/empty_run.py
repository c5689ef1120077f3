"""How long ``streamoffload run --once`` takes when there is nothing new to offload.

Run from the repository root:

    .venv/bin/python bench/empty_run.py
    .venv/bin/python bench/empty_run.py --messages 20 --partitions 1   # smoke size (tests/bench)

It starts the embedded pulsar-lite broker, publishes ``--messages`` (2,000) batched 1 KiB messages to each of
``--partitions`` (4) topic-partitions, runs ``streamoffload run --once`` once to offload them, then twice more
with nothing new, each as a user would (a new process: Spark's start-up included), and prints each run's wall
time. The job's log goes to a file whose path it prints. Nothing is left behind but that log.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamoffload.embedded_broker import EmbeddedBroker  # noqa: E402
from streamoffload.produce import produce  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per topic-partition (%(default)s)")
    parser.add_argument("--partitions", type=int, default=4, help="topic-partitions (%(default)s)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-empty-run-"))
    log = Path(tempfile.gettempdir()) / f"{work.name}.log"
    try:
        with EmbeddedBroker(work / "broker") as broker:
            topics = [f"persistent://public/default/empty-run-partition-{i}" for i in range(args.partitions)]
            for topic in topics:
                produce(broker.service_url, topic, args.messages, 1024, batching=True, batch_size=20)
            conf = work / "offload.toml"
            names = ", ".join(f'"{t}"' for t in topics)
            conf.write_text(
                f'[pulsar]\nservice_url = "{broker.service_url}"\ntopics = [{names}]\n'
                f'[store]\nroot = "{work / "store"}"\n[spark]\ncheckpoint = "{work / "checkpoint"}"\n'
                '[metrics]\naddress = ""\n'
            )
            cmd = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(conf), "--log-file", str(log)]
            first = f"first run (offloads {args.partitions} x {args.messages:,} messages)"
            for label in (first, "nothing new", "nothing new, again"):
                started = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, cwd=ROOT)
                wall = time.monotonic() - started
                print(f"{label}: exit {proc.returncode}, {wall:.1f} s wall")
                if proc.returncode:
                    print(proc.stderr.decode()[-2000:])
                    return 1
        print(f"log: {log}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
