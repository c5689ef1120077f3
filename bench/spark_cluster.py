"""A Spark standalone cluster on this machine, from pip's pyspark: a master and N workers, each its own JVM
(``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` inside the installed pyspark
package), on loopback, on ports the processes pick (``--port 0``; the logs say which), one core and a small heap
each, logs to files. Every process is the leader of its own process group: killing a worker's group kills it,
its executor JVM and that executor's Python workers at once, as a machine's loss would.

The end-to-end cluster test (``tests/cluster/``, through ``tests/fixtures/spark_cluster.py``) and
``bench/cluster.py`` use it; run alone it starts a cluster for trying README's ``spark-submit`` by hand:

    .venv/bin/python bench/spark_cluster.py --dir var/cluster     # prints the master URL; Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DAEMON_MEMORY = "256m"
"""The master's and the workers' own heaps (Spark's default is 1g each): they only schedule."""
START_TIMEOUT_S = 120.0

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_WORKER_REGISTERED = re.compile(r"Registering worker (\S+) with (\d+) cores")
_WORKER_ID = re.compile(r"Successfully registered with master spark://\S+")


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE_DIRS = ("streamoffload", "codecs", "storage", "checkpoints", "read", "streaming")
MASTER_PLACEHOLDER = "spark://master-host:7077"


@dataclass(frozen=True)
class StandaloneRecipe:
    """README's two blocks: packing the environment, and submitting the job."""

    pack: str
    submit: str


def standalone_recipe(readme: Path = README) -> StandaloneRecipe:
    text = readme.read_text(encoding="utf-8")
    found = re.search(r"<!-- cluster:standalone -->(.*?)<!-- /cluster:standalone -->", text, re.S)
    assert found, f"{readme}: no <!-- cluster:standalone --> section"
    blocks = re.findall(r"```bash\n(.*?)```", found.group(1), re.S)
    assert len(blocks) == 2, f"{readme}: the standalone section has {len(blocks)} bash blocks, expected 2"
    pack, submit = blocks
    assert "pip install streamoffload " in pack and MASTER_PLACEHOLDER in submit, (pack, submit)
    return StandaloneRecipe(pack, submit)


def submit_command(recipe: StandaloneRecipe, master_url: str, *, once: bool = False) -> str:
    """README's submit block for ``master_url`` (``run --once`` in place of ``run`` when ``once``)."""
    command = recipe.submit.replace(MASTER_PLACEHOLDER, master_url)
    if once:
        assert command.count(" run --conf ") == 1, command
        command = command.replace(" run --conf ", " run --once --conf ")
    return command


def _env_key(recipe: StandaloneRecipe) -> str:
    digest = hashlib.sha256(recipe.pack.encode())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def packed_environment(recipe: StandaloneRecipe) -> Path:
    """A directory holding ``env/`` and ``env.tar.gz`` made by README's packing block, kept under
    ``var/cluster-env/<key>/`` (``key``: a digest of the block, ``pyproject.toml`` and the package's sources).
    Built in place (a venv's scripts name the path it was made at); ``complete`` is written last."""
    target = ROOT / "var" / "cluster-env" / _env_key(recipe)
    if (target / "complete").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    script = recipe.pack.replace("pip install streamoffload ", f"pip install {ROOT} ")
    clean = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and "PYSPARK" not in k}
    log = target / "pack.log"
    with open(log, "wb") as out:
        proc = subprocess.run(["bash", "-euc", script], cwd=target, env=clean, stdout=out, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, f"README's packing block failed ({log}): {log.read_text(errors='replace')[-3000:]}"
    (target / "complete").write_text(script)
    return target


class ClusterError(RuntimeError):
    """A standalone cluster's process did not start, or stopped on its own."""


def spark_home() -> Path:
    """The installed pyspark package: pip's pyspark is a whole Spark distribution (``bin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_bin(name: str) -> Path:
    return spark_home() / "bin" / name


@dataclass
class ClusterProcess:
    """One JVM of the cluster, leader of its own process group."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, pattern: re.Pattern[str], count: int = 1, timeout: float = START_TIMEOUT_S) -> list[str]:
        """The first ``count`` matches of ``pattern`` in the log (its first group, or the whole match), once there;
        :class:`ClusterError` if the process exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            found = [m.group(1) if m.groups() else m.group(0) for m in pattern.finditer(self.log_text())]
            if len(found) >= count:
                return found[:count]
            if not self.running():
                raise ClusterError(f"{self.name} exited before its log said {pattern.pattern!r}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name}: no {pattern.pattern!r} in {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process group (the JVM and whatever it started: executors, Python workers)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the group (Spark's shutdown hooks run), SIGKILL what is left after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):  # children (executors) the JVM's exit left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers under ``work_dir`` (logs in ``work_dir/logs``, each worker's
    applications in ``work_dir/worker-N``)."""

    work_dir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1536m"
    """Each worker's memory for executors (an executor of ``spark.executor.memory`` 1g and its overhead fit)."""
    master_url: str = ""
    master: ClusterProcess | None = None
    worker_processes: list[ClusterProcess] = field(default_factory=list)
    _registered: int = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_CONF_DIR"):
            env.pop(name, None)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def start(self) -> StandaloneCluster:
        logs = self.work_dir / "logs"
        self.master = ClusterProcess(
            "spark master",
            [str(spark_bin("spark-class")), MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            logs / "master.log",
            self._env(),
        )
        self.master.start()
        [self.master_url] = self.master.wait_for(_MASTER_URL)
        self.worker_processes = [self._worker(i) for i in range(self.workers)]
        for worker in self.worker_processes:  # all at once: each JVM takes seconds to start
            worker.start()
        for worker in self.worker_processes:
            worker.wait_for(_WORKER_ID)
        self._registered = self.workers
        self.master.wait_for(_WORKER_REGISTERED, self._registered)
        return self

    def _worker(self, i: int) -> ClusterProcess:
        work = self.work_dir / f"worker-{i}"
        args = [str(spark_bin("spark-class")), WORKER_CLASS, "--host", "127.0.0.1", "--port", "0"]
        args += ["--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory]
        args += ["--work-dir", str(work), self.master_url]
        return ClusterProcess(f"spark worker {i}", args, self.work_dir / "logs" / f"worker-{i}.log", self._env())

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (again, after :meth:`kill_worker`) and wait until the master registered it."""
        assert self.master is not None
        worker = self.worker_processes[i]
        before = worker.log_text().count("Successfully registered with master")
        worker.start()
        worker.wait_for(_WORKER_ID, before + 1)
        self._registered += 1
        self.master.wait_for(_WORKER_REGISTERED, self._registered)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` with its executor and that executor's Python workers (its process group)."""
        self.worker_processes[i].kill()

    def executor_pids(self, i: int) -> list[int]:
        """The executor JVMs worker ``i`` runs now (its children running ``CoarseGrainedExecutorBackend``)."""
        worker = self.worker_processes[i]
        if not worker.running():
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == worker.pid and b"CoarseGrainedExecutorBackend" in cmdline:
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        for worker in self.worker_processes:
            worker.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def poll(condition: Callable[[], object], timeout: float, what: str, every: float = 0.2) -> object:
    """``condition()`` once it is truthy; :class:`ClusterError` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


@contextlib.contextmanager
def standalone_cluster(work_dir: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(work_dir, workers=workers)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="var/cluster", help="work directory: logs/, worker-N/ (default var/cluster)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(143))
    with standalone_cluster(Path(args.dir).resolve(), args.workers) as cluster:
        print(f"Spark standalone master at {cluster.master_url}, {args.workers} workers; logs in {args.dir}/logs")
        print("Ctrl-C stops the cluster", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(p.running() for p in [cluster.master, *cluster.worker_processes] if p is not None):
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
