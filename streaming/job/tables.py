"""Keeping the Iceberg tables of topics whose policy has ``offloadTable`` on current from the running job:
:class:`TableFollower`, a driver-side thread of each run, started and stopped with it (as retention is).

After each micro-batch the job tells it which topic-partitions sealed segments (``on_batch``, a batch listener:
it only marks them, so a micro-batch never waits for a table). For each marked topic whose policy has
``offloadTable`` on (a partitioned topic's table follows the partitioned topic's policy) it runs
``table.sync.sync_topic``, at most once per ``[table] commit_interval`` per table: segments sealed meanwhile are
coalesced into the next commit, and a first seal after a quiet interval is synced at once. At a run's start every
topic-partition the store holds is looked at once (a crash may have come between a seal and its table's commit),
and again after a policy edit (``offloadTable`` turned on). ``run --once`` syncs every such table at its end
(``sync_all``) instead of running the thread.

Exactly once is ``sync_topic``'s: each snapshot records the positions it holds, so a sync killed between its
Parquet files and its commit, or repeated, appends nothing twice. Its data files are named after the run's epoch
(``SyncOptions.writer``), so two runs never write the same file names.

**Fencing**: right before each commit (``SyncHooks.before_commit``) the follower checks that the run still holds
its writer lease (the renewer's verdict, then ``WriterLease.check``: a later epoch exists): a job whose lease was
taken over never commits. A commit racing the take-over (checked an instant before it) is still exactly once: the
new run's syncs are one more writer under Iceberg's optimistic concurrency.

**Maintenance**: after a sync, a table not maintained for ``[table] maintain_every`` (since the run's start, or
its last maintenance) is maintained in the same thread (``table.maintenance.maintain_table``: retention,
compaction with ``compact_min_files`` / ``compact_target_file_size``, snapshot expiry keeping ``keep_snapshots``
and those younger than ``snapshot_max_age``, orphan removal; the dead-letter table too), so never at the same time
as a sync of this follower; a sync of the table elsewhere is one more writer (maintenance plans again after a
commit lost to it). Every data file it writes carries the run's writer name; a fenced run maintains nothing.
Failures are logged and counted as a sync's (``TableFigures.maintenance_failures``) and tried again at the next
interval; what each did is counted too (``TableFigures``: the ``streamoffload_table_*`` maintenance families).

**Failures** (the catalog unreachable, commits lost to other writers, the store failing, pyiceberg missing) are
logged in one line, counted (``TableFigures.commit_failures``: a sync that failed committed nothing), and the table
is tried again at the next interval; they never stop or slow the offload.

Why on the driver: a table has one commit point (the catalog's pointer swap), which the driver, holding the
writer lease, is the one process to own; the executors stay the offload's. The cost is the driver process's
reading of the sealed segments and writing of Parquet (pyarrow, mostly outside the GIL), in its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.lease import FencedError
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.topics import TopicName
from streamoffload.config import TableSettings
from streamoffload.pulsar.schema_registry import BrokerSchemaRegistry
from streamoffload.read.segment.errors import TopicNotOffloadedError
from streamoffload.redaction import redact
from streamoffload.storage.location import ScopedStore, StoreLocation
from streamoffload.streaming.job.report import BatchReport

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from streamoffload.table.sync import SyncHooks, SyncReport

log = logging.getLogger(__name__)

IDLE_WAIT_S = 60.0
"""How long the thread sleeps with nothing marked (a mark wakes it at once)."""


def writer_name(epoch: int) -> str:
    """The run's name in the table's data file names (``SyncOptions.writer``)."""
    return f"epoch-{epoch:08d}"


@dataclass
class TableFigures:
    """One table as this process's followers saw it (the metrics' ``streamoffload_table_*`` families): commits,
    rows, data files and their bytes appended, syncs that failed (``commit_failures``: nothing of theirs was
    committed), how far the table was behind the store after its last sync (``table.status``), and when it last
    committed (seconds since the epoch)."""

    topic: str
    table: str
    commits: int = 0
    commit_failures: int = 0
    rows_appended: int = 0
    files_appended: int = 0
    bytes_appended: int = 0
    segments_behind: int | None = None
    entries_behind: int | None = None
    last_commit_s: float | None = None
    last_error: str | None = None
    maintenances: int = 0
    maintenance_failures: int = 0
    files_compacted: int = 0
    """Data files compaction replaced (in the table and its dead-letter table, as the counts below)."""
    snapshots_expired: int = 0
    orphans_removed: int = 0
    """Files orphan removal deleted: data files of failed attempts and replaced ones, unnamed manifests."""
    rows_retained_away: int = 0
    """Rows retention removed: of segments the store no longer has."""
    dead_letters_appended: int = 0
    """Rows appended to the dead-letter table (values that did not decode)."""


def _one_line(err: BaseException) -> str:
    """An error in one line, secrets masked (a catalog URI's password)."""
    text = str(err).strip().splitlines()
    return redact(f"{type(err).__name__}: {text[0] if text else ''}")[:500]


class TableFollower:
    """The tables of one run (module notes). ``policy_for`` is the job's live policy (``PolicySource``),
    ``check_lease`` raises ``FencedError`` once the run's writer lease is lost, ``hooks`` are the tests' (a crash
    between Parquet and commit, another writer), ``carried`` the previous run's figures."""

    def __init__(
        self,
        location: StoreLocation,
        settings: TableSettings,
        policy_for: Callable[[str], OffloadPolicy],
        *,
        epoch: int,
        check_lease: Callable[[], None],
        keyring: KeyRing | None = None,
        hooks: SyncHooks | None = None,
        carried: Iterable[TableFigures] = (),
        clock: Callable[[], float] = time.monotonic,
        schema_registry: BrokerSchemaRegistry | None = None,
    ) -> None:
        self.location = location
        self.schema_registry = schema_registry
        """The broker's, for topics whose ``offloadTableSchema`` is ``broker`` (``table.registry_schema``)."""
        self.settings = settings
        self.policy_for = policy_for
        self.epoch = epoch
        self.check_lease = check_lease
        self.keyring = keyring
        self.hooks = hooks
        self.clock = clock
        self.interval_s = settings.commit_interval_s
        self.maintain_every_s = settings.maintain_every_s
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._pending: set[str] = set()
        """Tables (their topics) to sync when due."""
        self._known: set[str] = set()
        """Every topic seen, whatever its policy: looked at again after a policy edit."""
        self._last_sync: dict[str, float] = {}
        self._started = clock()
        self._last_maintained: dict[str, float] = {}
        """By topic; a table never maintained by this run counts from the run's start."""
        self._figures: dict[str, TableFigures] = {f.topic: replace(f) for f in carried}
        """By topic; ``carried`` from the previous run's follower, so the counters go on from there."""
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._scoped: ScopedStore | None = None
        self._catalog: Catalog | None = None
        self._fenced = False
        self._missing_library: str | None = None

    # -- what to sync ---------------------------------------------------------------------------

    def mark(self, topics: Iterable[str]) -> None:
        """Sync the tables of ``topics`` (topic-partitions or topics) when due."""
        bases = set()
        for topic in topics:
            try:
                bases.add(str(TopicName.parse(topic).base))
            except ValueError:
                log.debug("tables: not a topic name: %r", topic)
        if not bases:
            return
        with self._lock:
            self._known |= bases
            self._pending |= bases
        self._wake.set()

    def on_batch(self, report: BatchReport) -> None:
        """A batch listener: the topics whose segments the micro-batch sealed."""
        self.mark(seal.topic for seal in report.stats.sealed)

    def recheck(self) -> None:
        """The policy changed: look at every topic seen again (``offloadTable`` may be on now)."""
        with self._lock:
            known = set(self._known)
        self.mark(known)

    def figures(self) -> list[TableFigures]:
        """A copy of each table's figures, by table name."""
        with self._lock:
            return [replace(f) for _, f in sorted(self._figures.items())]

    def _wanted(self, topic: str) -> bool:
        try:
            return self.policy_for(topic).offloadTable
        except Exception as err:  # a policy that does not resolve: the job says so elsewhere
            log.warning("tables: the policy of %s does not resolve (%s); its table is not synced", topic, err)
            return False

    def _due(self, force: bool) -> tuple[list[str], float | None]:
        """The pending tables due now (dropping those whose policy has no table), and the seconds until the
        next one is due (None: nothing pending)."""
        now = self.clock()
        with self._lock:
            pending = sorted(self._pending)
        due: list[str] = []
        wait: float | None = None
        for topic in pending:
            if not self._wanted(topic):
                with self._lock:
                    self._pending.discard(topic)
                continue
            last = self._last_sync.get(topic)
            left = 0.0 if force or last is None else last + self.interval_s - now
            if left <= 0:
                due.append(topic)
            else:
                wait = left if wait is None else min(wait, left)
        return due, wait

    # -- syncing ---------------------------------------------------------------------------------

    def sync_due(self, *, force: bool = False) -> float | None:
        """Sync every pending table that is due (all of them with ``force``); returns the seconds until the next
        one is due (None: nothing pending)."""
        with self._sync_lock:
            due, wait = self._due(force)
            for topic in due:
                if self._stopping.is_set() and not force:
                    break
                with self._lock:
                    self._pending.discard(topic)
                self._last_sync[topic] = self.clock()
                if not self._sync(topic):
                    with self._lock:
                        self._pending.add(topic)  # tried again at the next interval
                    wait = self.interval_s if wait is None else min(wait, self.interval_s)
                elif self._maintenance_due(topic):
                    self._maintain(topic)
            return wait

    def _maintenance_due(self, topic: str) -> bool:
        if self.maintain_every_s <= 0 or self._fenced or self._missing_library is not None or self._stopping.is_set():
            return False  # stopping: the next run maintains (a maintenance would hold up the stop)
        last = self._last_maintained.get(topic, self._started)
        return self.clock() - last >= self.maintain_every_s

    def sync_all(self, topics: Iterable[str] = ()) -> None:
        """``run --once``'s end: sync the tables of ``topics`` and of every topic marked, now."""
        self.mark(topics)
        self.sync_due(force=True)

    def _open(self) -> tuple[ScopedStore, Catalog]:
        from streamoffload.table.catalog import catalog_settings, open_catalog

        if self._scoped is None:
            self._scoped = self.location.open()
        if self._catalog is None:
            settings = catalog_settings(self.location, self.settings.catalog, self.settings.warehouse)
            self._catalog = open_catalog(settings)
        return self._scoped, self._catalog

    def _before_commit(self) -> None:
        if self.hooks is not None and self.hooks.before_commit is not None:
            self.hooks.before_commit()
        self.check_lease()

    def _sync(self, topic: str) -> bool:
        """Sync ``topic``'s table; False when it failed (logged in one line and counted)."""
        if self._fenced:
            return True  # a fenced run commits nothing more; its successor syncs
        try:
            from streamoffload.table.sync import SyncHooks, SyncOptions, sync_topic, table_name
        except ModuleNotFoundError as err:
            if self._missing_library is None:
                log.error(
                    "tables: offloadTable is on for %s but pyiceberg is not installed (%s): "
                    "pip install 'streamoffload[table]'",
                    topic,
                    err.name,
                )
            self._missing_library = str(err.name)
            return True
        with self._lock:
            figures = self._figures.setdefault(topic, TableFigures(topic, table_name(topic)))
        sizes: dict[str, int] = {}  # of the data files written, for the bytes of those committed

        def written(table: Table, files: list[DataFile]) -> None:
            sizes.update((f.file_path, f.file_size_in_bytes) for f in files)
            if self.hooks is not None and self.hooks.written is not None:
                self.hooks.written(table, files)

        hooks = SyncHooks(written=written, before_commit=self._before_commit)
        options = SyncOptions(
            segments_per_commit=self.settings.segments_per_commit,
            writer=writer_name(self.epoch),
            keyring=self.keyring,
            value_schema=self.policy_for(topic).offloadTableSchema,
            schema_registry=self.schema_registry,
        )
        try:
            scoped, catalog = self._open()
            report = sync_topic(scoped, catalog, topic, options, hooks)
        except TopicNotOffloadedError:  # nothing sealed yet: its first seal marks it again
            return True
        except FencedError as err:
            self._fenced = True
            with self._lock:
                figures.commit_failures += 1
                figures.last_error = _one_line(err)
            log.error("table %s: not committed: %s", figures.table, err)
            return True
        except Exception as err:
            self._catalog = None  # opened again at the next try (a catalog that went away)
            with self._lock:
                figures.commit_failures += 1
                figures.last_error = _one_line(err)
            log.warning(
                "table %s: sync failed (%s); trying again in %.0f s", figures.table, _one_line(err), self.interval_s
            )
            return False
        self._record(figures, report, sizes)
        self._lag(figures, scoped, catalog)
        return True

    def _maintain(self, topic: str) -> None:
        """Maintain ``topic``'s table (module notes); a failure is logged in one line, counted, and tried again
        after the next interval."""
        from streamoffload.table.maintenance import MaintenanceOptions, maintain_table
        from streamoffload.table.sync import SyncHooks, table_name

        self._last_maintained[topic] = self.clock()
        with self._lock:
            figures = self._figures.setdefault(topic, TableFigures(topic, table_name(topic)))
        options = MaintenanceOptions(
            target_file_bytes=self.settings.compact_target_file_bytes,
            min_files=self.settings.compact_min_files,
            keep_snapshots=self.settings.keep_snapshots,
            expire_older_than_s=self.settings.snapshot_max_age_s,
            writer=writer_name(self.epoch),
        )
        # The lease is checked before the steps and again before each rewrite's commit (``written``).
        hooks = SyncHooks(written=lambda _table, _files: self.check_lease())
        start = time.perf_counter()
        try:
            self.check_lease()
            scoped, catalog = self._open()
            report = maintain_table(scoped, catalog, topic, options, hooks)
        except FencedError as err:
            self._fenced = True
            with self._lock:
                figures.maintenance_failures += 1
                figures.last_error = _one_line(err)
            log.error("table %s: not maintained: %s", figures.table, err)
            return
        except Exception as err:
            self._catalog = None
            with self._lock:
                figures.maintenance_failures += 1
                figures.last_error = _one_line(err)
            log.warning(
                "table %s: maintenance failed (%s); trying again in %.0f s",
                figures.table,
                _one_line(err),
                self.maintain_every_s,
            )
            return
        compacted, expired = report.files_compacted, report.snapshots_expired
        with self._lock:
            figures.maintenances += 1
            figures.files_compacted += compacted
            figures.snapshots_expired += expired
            figures.orphans_removed += report.orphans_removed
            figures.rows_retained_away += report.rows_retained_away
        log.info(
            "table %s: maintained in %.2f s: %d data file(s) compacted, %d snapshot(s) expired, %d orphan file(s) "
            "removed, %d row(s) of deleted segments removed",
            figures.table,
            time.perf_counter() - start,
            compacted,
            expired,
            report.orphans_removed,
            report.rows_retained_away,
        )

    def _record(self, figures: TableFigures, report: SyncReport, sizes: dict[str, int]) -> None:
        with self._lock:
            figures.commits += len(report.commits)
            figures.rows_appended += report.rows
            figures.dead_letters_appended += report.dead_letters
            figures.files_appended += sum(len(c.files) for c in report.commits)
            figures.bytes_appended += sum(sizes.get(path, 0) for c in report.commits for path in c.files)
            figures.last_error = None
            if report.commits:
                figures.last_commit_s = time.time()
        if report.commits:
            log.info(
                "table %s: appended %d message(s) of %d segment(s) in %d commit(s) (snapshot %s)",
                report.table,
                report.rows,
                report.segments,
                len(report.commits),
                report.position.snapshot_id,
            )

    def _lag(self, figures: TableFigures, scoped: ScopedStore, catalog: Catalog) -> None:
        """How far the table is behind the store now (segments sealed during the sync)."""
        from streamoffload.table.status import table_status

        try:
            status = table_status(scoped, catalog, figures.topic)
        except Exception as err:
            log.info("table %s: its lag is unknown (%s)", figures.table, _one_line(err))
            return
        with self._lock:
            figures.segments_behind, figures.entries_behind = status.segments_behind, status.entries_behind

    # -- the thread ------------------------------------------------------------------------------

    def start(self) -> None:
        """Sync in a daemon thread until ``stop``."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="streamoffload-tables", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (a sync under way finishes its commit) and close the store. Idempotent."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():  # it closes what it opened when the sync ends
                log.warning("tables: a sync is still running after %.0f s; leaving it to finish", timeout)
                return
        self._close()

    def _close(self) -> None:
        with self._sync_lock:
            if self.schema_registry is not None:
                self.schema_registry.close()
            if self._scoped is not None:
                self._scoped.store.close()
                self._scoped = None
            self._catalog = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        wait: float | None = 0.0
        try:
            while not self._stopping.is_set():
                self._wake.wait(IDLE_WAIT_S if wait is None else max(wait, 0.0))
                self._wake.clear()
                if self._stopping.is_set():
                    return
                try:
                    wait = self.sync_due()
                except Exception:  # sync_due logs each table's failure; this is anything else
                    log.warning("tables: a pass failed", exc_info=True)
                    wait = self.interval_s
        finally:
            if self._stopping.is_set():
                self._close()
