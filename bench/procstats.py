"""What a benchmark's processes use, read from /proc and the JVM: CPU seconds by process group, resident
and proportional memory by process kind, and the JVM's heap pools. Shared by the bench scripts; Linux only."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

# --- CPU seconds by process group, from /proc ------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, str, float, float] | None:
    """(ppid, comm, own CPU seconds, reaped children's CPU seconds) of a live process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # After "pid (comm)": state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based in stat(5).
    ppid = int(fields[1])
    own = (int(fields[11]) + int(fields[12])) / _TICK
    children = (int(fields[13]) + int(fields[14])) / _TICK
    return ppid, comm, own, children


def _process_table() -> tuple[dict[int, tuple[int, str, float, float]], dict[int, list[int]]]:
    """Every live process's ``_proc_stat``, and each one's children (for ``_subtree``)."""
    table: dict[int, tuple[int, str, float, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _proc_stat(int(name))) is not None:
            table[int(name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _comm, _own, _reaped) in table.items():
        children.setdefault(ppid, []).append(pid)
    return table, children


def cpu_by_group(broker_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of: the broker, the Spark JVM, its Python workers, and this (driver) process.

    Workers that exited were reaped by their parent (PySpark's daemon) and count in its children's
    times, so differences of two snapshots are right even when workers come and go in between.
    """
    table, children = _process_table()
    me = os.getpid()
    groups = {"broker": 0.0, "jvm": 0.0, "python workers": 0.0, "driver": table[me][2] if me in table else 0.0}
    broker = set(_subtree(children, broker_pid)) if broker_pid is not None and broker_pid in table else set()
    groups["broker"] = sum(table[p][2] + table[p][3] for p in broker)
    for pid in children.get(me, []):
        if pid in broker:
            continue  # Apache Pulsar standalone is a JVM this process started too: the broker's, not Spark's
        if table[pid][1] == "java":
            # The JVM's children are all Python (daemons, workers, data source planners); those that
            # exited count in its children's times.
            groups["jvm"] += table[pid][2]
            groups["python workers"] += table[pid][3]
            groups["python workers"] += sum(table[p][2] + table[p][3] for p in _subtree(children, pid) if p != pid)
        elif is_fork_server(pid):
            # Spark's Python processes forked with the imports done (streaming/runtime/fork_server.py): the server
            # itself, the daemons it forked for Spark and theirs.
            groups["python workers"] += sum(table[p][2] + table[p][3] for p in _subtree(children, pid))
    return groups


def tree_cpu(root: int) -> float:
    """CPU seconds so far of ``root`` and every process below it, those that exited included (they count in
    their parents' reaped children's times): a job started as a subprocess, its JVM and Python workers."""
    table, children = _process_table()
    return sum(table[pid][2] + table[pid][3] for pid in _subtree(children, root) if pid in table)


def is_fork_server(pid: int) -> bool:
    return "streamoffload.streaming.runtime.fork_server" in _cmdline(pid)


def child_pids(word: str) -> list[int]:
    """This process's live children whose command line contains ``word``: a server the bench started (e.g.
    ``moto_server``), to meter as ``CpuMeter(pid)``, whose ``broker`` group is then that server's tree."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _proc_stat(int(name))
            if stat is not None and stat[0] == me and word in _cmdline(int(name)):
                out.append(int(name))
    return out


@dataclass
class CpuMeter:
    broker_pid: int | None
    start: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    def __enter__(self) -> CpuMeter:
        self.start = cpu_by_group(self.broker_pid)
        return self

    def __exit__(self, *exc: object) -> None:
        end = cpu_by_group(self.broker_pid)
        self.used = {k: max(end[k] - self.start.get(k, 0.0), 0.0) for k in end}

    def render(self, wall: float) -> str:
        return self.describe(self.used, wall)

    @staticmethod
    def describe(used: dict[str, float], wall: float) -> str:
        total = sum(used.values())
        parts = ", ".join(f"{k} {v:.1f}" for k, v in used.items())
        return f"CPU s: {parts} (total {total:.1f} in {wall:.1f} s wall = {total / wall:.2f} cores)"


class ProcessCensus:
    """Which Python processes the Spark JVM starts while it runs, how many of each kind, and their CPU.

    Sampled every ``interval`` seconds in a thread: a process that lives shorter than that is missed, and
    one's CPU after its last sample is lost, so the figures are a floor. It answers "where do the Python
    workers' CPU seconds go": a process started per query or per micro-batch pays its imports each time.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds at its last sample)
        self._before: dict[int, float] = {}  # processes already running: their CPU seconds at the start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-census", daemon=True)

    def __enter__(self) -> ProcessCensus:
        for pid in self._python_pids():
            stat = _proc_stat(pid)
            if stat is not None:
                self._before[pid] = stat[2]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _python_pids(self) -> list[int]:
        return spark_python_pids(_children_by_parent())

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._python_pids():
                stat = _proc_stat(pid)
                if stat is None:
                    continue
                if pid in self.seen:
                    kind = self.seen[pid][0]
                else:
                    kind = _process_kind(pid) + (" (already running)" if pid in self._before else "")
                self.seen[pid] = (kind, stat[2] - self._before.get(pid, 0.0))
            self._stop.wait(self.interval)

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """Per kind: (processes seen, CPU seconds spent in the census)."""
        out: dict[str, tuple[int, float]] = {}
        for kind, cpu in self.seen.values():
            n, total = out.get(kind, (0, 0.0))
            out[kind] = (n + 1, total + cpu)
        return out

    def render(self) -> str:
        kinds = sorted(self.by_kind().items(), key=lambda kv: -kv[1][1])
        return "; ".join(f"{kind} x{n} {cpu:.1f} CPU s" for kind, (n, cpu) in kinds)


def _thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of ``pid``: (its name with digits dropped, CPU seconds)."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        kind = "".join(c for c in name if not c.isdigit()).strip(" -#")
        out[int(tid)] = (kind, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


class JvmThreadCensus:
    """The Spark JVM's CPU seconds by thread name (Linux keeps 15 characters of it; digits dropped, so the
    pool's threads add up), sampled every ``interval`` seconds: which of its parts works while a run lasts
    (task threads, the stream's thread, the JIT compilers, the garbage collector, RocksDB...)."""

    def __init__(self, interval: float = 0.5, broker_pid: int | None = None) -> None:
        self.interval = interval
        self.broker_pid = broker_pid  # a broker that is a JVM this process started (Apache Pulsar): not Spark's
        self.jvm: int | None = None
        self._start: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jvm-thread-census", daemon=True)

    def __enter__(self) -> JvmThreadCensus:
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _proc_stat(int(name))
                if stat is not None and stat[0] == os.getpid() and stat[1] == "java" and int(name) != self.broker_pid:
                    self.jvm = int(name)
        if self.jvm is not None:
            self._start = {tid: cpu for tid, (_n, cpu) in _thread_cpu(self.jvm).items()}
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self.jvm is not None:
            self.last.update(_thread_cpu(self.jvm))

    def _run(self) -> None:
        while not self._stop.is_set() and self.jvm is not None:
            self.last.update(_thread_cpu(self.jvm))
            self._stop.wait(self.interval)

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for tid, (name, cpu) in self.last.items():
            out[name] = out.get(name, 0.0) + cpu - self._start.get(tid, 0.0)
        return out

    def render(self, top: int = 8) -> str:
        names = sorted(self.by_name().items(), key=lambda kv: -kv[1])
        return "; ".join(f"{name} {cpu:.1f}" for name, cpu in names[:top] if cpu >= 0.05)


# --- resident memory by process, from /proc --------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _pss_bytes(pid: int) -> int:
    """Proportional set size: forked Python workers share the daemon's pages, which RSS counts in each."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _rss_bytes(pid)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RssSampler:
    """Peak RSS of this process, the Spark JVM, each of its Python workers (and their sum at one moment)
    and the broker, sampled every ``interval`` seconds in a thread."""

    def __init__(self, broker_pid: int | None, interval: float = 0.2) -> None:
        self.broker_pid = broker_pid
        self.interval = interval
        self.peaks: dict[str, int] = {"driver python": 0, "jvm": 0, "python workers (sum of PSS)": 0, "broker": 0}
        self.worker_peaks: dict[int, tuple[int, str]] = {}
        self.kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        parents = _children_by_parent()
        me = os.getpid()
        self._peak("driver python", _rss_bytes(me))
        broker = set(_subtree(parents, self.broker_pid)) if self.broker_pid is not None else set()
        self._peak("broker", sum(_rss_bytes(p) for p in broker))
        for pid in parents.get(me, []):
            if pid not in broker and "java" in _cmdline(pid).split(" ")[0]:
                self._peak("jvm", _rss_bytes(pid))
        total = 0
        for worker in spark_python_pids(parents):
            rss = _rss_bytes(worker)
            total += _pss_bytes(worker)
            if worker not in self.kinds:  # named at first sight: an exiting process has no cmdline
                self.kinds[worker] = _process_kind(worker)
            if rss > self.worker_peaks.get(worker, (0, ""))[0]:
                self.worker_peaks[worker] = (rss, self.kinds[worker])
        self._peak("python workers (sum of PSS)", total)

    def _peak(self, name: str, value: int) -> None:
        self.peaks[name] = max(self.peaks.get(name, 0), value)

    def largest_workers(self) -> dict[str, int]:
        """Per kind of Python worker (daemon, worker, source runner...), the largest peak of one process."""
        out: dict[str, int] = {}
        for rss, kind in self.worker_peaks.values():
            out[kind] = max(out.get(kind, 0), rss)
        return out


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from /proc."""
    return _process_table()[1]


def _subtree(parents: dict[int, list[int]], root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def spark_python_pids(parents: dict[int, list[int]]) -> list[int]:
    """Spark's Python processes for this driver: the JVM's descendants, and the fork server's subtree
    (streaming/runtime/fork_server.py: the daemons it forked for Spark, and what they forked)."""
    out: list[int] = []
    for pid in parents.get(os.getpid(), []):
        if "java" in _cmdline(pid).split(" ")[0]:
            out.extend(p for p in _subtree(parents, pid) if p != pid)
        elif is_fork_server(pid):
            out.extend(_subtree(parents, pid))
    return out


def _process_kind(pid: int) -> str:
    """A Spark Python process's kind: the module in its command line, or for one the fork server forked
    (whose command line is the server's) the name the server gave it, ``fork:<last part of the module>``."""
    cmdline = _cmdline(pid)
    if "streamoffload.streaming.runtime.fork_server" not in cmdline:
        return _worker_kind(cmdline)
    if stat := _proc_stat(pid):
        return f"fork:{stat[1]}" if stat[1] != "python" else "fork server"
    return "(exited before it was named)"


def _worker_kind(cmdline: str) -> str:
    """The module a worker runs: ``python -m pyspark.daemon pyspark.worker`` is a ``pyspark.worker``."""
    words = [w for w in cmdline.split() if w.startswith("pyspark.") or w.startswith("streamoffload")]
    if words:
        return words[-1]
    return cmdline.split(" ")[0].rsplit("/", 1)[-1] or "(exited before it was named)"


def jvm_heap_pools(spark: Any, reset: bool = False) -> dict[str, tuple[int, int]]:
    """Per JVM heap pool: (peak used, max) in bytes since the last reset."""
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    out: dict[str, tuple[int, int]] = {}
    for pool in management.getMemoryPoolMXBeans():
        if str(pool.getType().toString()) != "Heap memory":
            continue
        if reset:
            pool.resetPeakUsage()
        peak = pool.getPeakUsage()
        out[str(pool.getName())] = (int(peak.getUsed()), int(peak.getMax()))
    return out


# --- one job's process tree, sampled from outside (bench/soak.py) ------------------------------------


def open_fds(pid: int) -> int:
    """File descriptors the process holds open now (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def thread_count(pid: int) -> int:
    """Threads of the process now (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


@dataclass
class JobTreeSample:
    """One moment of a ``streamoffload run`` process tree: the Python driver, the Spark JVM it launched
    (driver and executor in one on ``local[n]``) and Spark's Python processes (workers, daemons, source
    runners: the JVM's descendants and the fork server's, ``streaming/fork_server.py``). fds and threads are the
    driver's and the JVM's: the long-lived processes, whose counts a leak would raise; workers come and go with
    tasks, so theirs are kept apart."""

    driver_rss: int
    jvm_pid: int | None
    jvm_rss: int
    workers: int
    workers_pss: int
    """Proportional set size summed over the workers: forked workers share the daemon's pages."""
    worker_fds: int
    fds: int
    threads: int


def job_tree_sample(driver_pid: int) -> JobTreeSample:
    parents = _children_by_parent()
    jvms = [p for p in parents.get(driver_pid, []) if "java" in _cmdline(p).split(" ")[0]]
    jvm = jvms[0] if jvms else None
    workers = [p for p in _subtree(parents, jvm) if p != jvm] if jvm is not None else []
    # The fork server is the driver's child; Spark's daemons and workers it forked are its descendants, not the
    # JVM's (whose children are then the fork clients).
    for server in (p for p in parents.get(driver_pid, []) if p != jvm and is_fork_server(p)):
        workers.extend(_subtree(parents, server))
    long_lived = [driver_pid] if jvm is None else [driver_pid, jvm]
    return JobTreeSample(
        driver_rss=_rss_bytes(driver_pid),
        jvm_pid=jvm,
        jvm_rss=_rss_bytes(jvm) if jvm is not None else 0,
        workers=len(workers),
        workers_pss=sum(_pss_bytes(p) for p in workers),
        worker_fds=sum(open_fds(p) for p in workers),
        fds=sum(open_fds(p) for p in long_lived),
        threads=sum(thread_count(p) for p in long_lived),
    )


@dataclass
class HeapAfterGc:
    heap_used: int
    """Bytes of heap in use right after a full collection: the old generation's live set (a full G1
    collection leaves nothing young)."""
    metaspace_used: int
    heap_committed: int = 0
    """Bytes of heap the JVM holds from the OS after the collection (``GC.heap_info``'s total)."""
    native_committed: dict[str, int] = field(default_factory=dict)
    """Native memory tracking's committed bytes by category (``Java Heap``, ``Thread``, ``Class``, ...; ``Total``)
    when the JVM runs with ``-XX:NativeMemoryTracking=summary``; else empty. Memory that native code allocates
    itself (RocksDB, glibc's arenas for it) is not tracked: the RSS minus ``Total`` is that, roughly."""


_HEAP_USED = re.compile(r"heap\s+total (\d+)K, used (\d+)K")
_METASPACE_USED = re.compile(r"Metaspace\s+used (\d+)K")
_NMT_TOTAL = re.compile(r"^Total: reserved=\d+KB, committed=(\d+)KB", re.MULTILINE)
_NMT_CATEGORY = re.compile(r"^-\s+(\S[^(]*?)\s+\(reserved=\d+KB, committed=(\d+)KB\)", re.MULTILINE)


def native_memory(jcmd_output: str) -> dict[str, int]:
    """``VM.native_memory summary``'s committed bytes by category, with ``Total``; empty without NMT."""
    total = _NMT_TOTAL.search(jcmd_output)
    if total is None:
        return {}
    found = {name.strip(): int(kib) * 1024 for name, kib in _NMT_CATEGORY.findall(jcmd_output)}
    found["Total"] = int(total.group(1)) * 1024
    return found


def heap_after_full_gc(jvm_pid: int, scratch: str) -> HeapAfterGc | None:
    """Force a full collection in the JVM (``jcmd GC.run``, i.e. ``System.gc()``) and read the heap right
    after it (``GC.heap_info``), in one ``jcmd`` (about 0.3 CPU s). ``scratch``: a file for jcmd's command
    list. None when jcmd is missing or the JVM does not answer (e.g. it is exiting). A JVM started with
    ``-XX:NativeMemoryTracking=summary`` also reports its native memory by category."""
    with open(scratch, "w", encoding="ascii") as f:
        f.write("GC.run\nGC.heap_info\nVM.native_memory summary\n")
    try:
        out = subprocess.run(
            ["jcmd", str(jvm_pid), "-f", scratch], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    heap, metaspace = _HEAP_USED.search(out), _METASPACE_USED.search(out)
    if heap is None or metaspace is None:
        return None
    return HeapAfterGc(
        int(heap.group(2)) * 1024,
        int(metaspace.group(1)) * 1024,
        heap_committed=int(heap.group(1)) * 1024,
        native_committed=native_memory(out),
    )
