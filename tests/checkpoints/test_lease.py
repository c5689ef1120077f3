"""The writer lease: one instance writes a store prefix; a later epoch fences the earlier writer, whose
checks, renewals and commits are then refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.checkpoints.lease import (
    KEEP_EPOCHS,
    FencedError,
    LeaseHeldError,
    Process,
    WriterLease,
    check_epoch,
    instance_id,
)
from streamoffload.checkpoints.metadata_store import CommitConflictError, MetadataStore
from streamoffload.codecs.errors import FormatError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from tests.checkpoints.segments import NOW, TOPIC, write_segment

TTL_MS = 30_000


def lease(store: ObjectStore, holder: str) -> WriterLease:
    return WriterLease(ScopedStore(store, "prefix"), holder, ttl_ms=TTL_MS)


def test_a_second_writers_epoch_fences_the_first(store: ObjectStore) -> None:
    first, second = lease(store, "host-a"), lease(store, "host-b")
    assert first.acquire(now_ms=NOW).epoch == 1

    with pytest.raises(LeaseHeldError, match=r"host-a.*epoch 1"):  # live: refused, naming the holder
        second.acquire(now_ms=NOW + TTL_MS - 1)
    assert second.acquire(now_ms=NOW + TTL_MS).epoch == 2  # expired: taken over

    with pytest.raises(FencedError, match=r"epoch 1\) was taken over by instance host-b"):
        first.check()
    with pytest.raises(FencedError):
        first.renew(now_ms=NOW + TTL_MS + 1)
    with pytest.raises(FencedError, match="epoch 1"):
        check_epoch(ScopedStore(store, "prefix"), 1)  # the executors' check before a commit
    check_epoch(ScopedStore(store, "prefix"), 2)
    check_epoch(ScopedStore(store, "prefix"), 0)  # no lease: a library user, never fenced

    first.release()  # a fenced writer's release leaves the new holder's lease alone
    current = second.current()
    assert current is not None and (current.holder, current.epoch, current.ttl_ms) == ("host-b", 2, TTL_MS)
    second.renew(now_ms=NOW + TTL_MS + 5)
    assert second.current().renewed_ms == NOW + TTL_MS + 5  # type: ignore[union-attr]


def test_a_lease_taken_between_the_check_and_the_put_leaves_one_winner(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances starting at once (seen in CI on moto: both won): ``b`` finds no lease, then ``a`` takes epoch
    1 before ``b`` writes. ``b`` must collide on epoch 1, not list again and step past ``a`` to epoch 2."""
    a, b = lease(store, "host-a"), lease(store, "host-b")
    listed = WriterLease._epochs
    checked: list[list[int]] = []

    def a_takes_it_meanwhile(self: WriterLease) -> list[int]:
        epochs = listed(self)
        if self is b and not checked:  # b's listing: nothing held yet; then a takes it
            checked.append(epochs)
            a.acquire(now_ms=NOW)
        return epochs

    monkeypatch.setattr(WriterLease, "_epochs", a_takes_it_meanwhile)
    with pytest.raises(LeaseHeldError, match=r"at the same moment: instance host-a"):
        b.acquire(now_ms=NOW)
    monkeypatch.undo()
    assert checked == [[]]
    current = b.current()
    assert current is not None and (current.holder, current.epoch) == ("host-a", 1)
    a.check()  # a holds it, unfenced


def test_the_same_instance_takes_its_own_lease_over_at_once(store: ObjectStore) -> None:
    holder = instance_id("/checkpoints/job", host="host-a")
    assert holder == instance_id("/checkpoints/job", host="host-a") != instance_id("/other", host="host-a")
    before = lease(store, holder)
    before.acquire(now_ms=NOW)
    after = lease(store, holder)  # a restart after a crash: the lease is still live
    assert after.acquire(now_ms=NOW + 1).epoch == 2
    with pytest.raises(FencedError):
        before.check()


def test_force_takes_a_live_lease_and_release_lets_it_go_at_once(store: ObjectStore) -> None:
    first, second = lease(store, "host-a"), lease(store, "host-b")
    first.acquire(now_ms=NOW)
    assert second.acquire(force=True, now_ms=NOW + 1).epoch == 2
    third = lease(store, "host-c")
    second.release()  # a clean stop: ttl 0, so another instance need not wait
    assert third.acquire(now_ms=NOW + 2).epoch == 3


def test_old_epochs_are_pruned_and_a_pruned_writer_counts_as_fenced(fs_store: ObjectStore) -> None:
    writers = [lease(fs_store, f"host-{i}") for i in range(KEEP_EPOCHS + 2)]
    for i, writer in enumerate(writers):
        writer.acquire(force=True, now_ms=NOW + i)
    listed = [info.key for info in fs_store.list(keys.prefix_meta_prefix("prefix", "writers"))]
    assert len(listed) == KEEP_EPOCHS
    with pytest.raises(FencedError):
        writers[0].check()  # its epoch object is gone: taken over
    writers[-1].check()


def test_a_fenced_writers_commit_is_refused_by_the_store(store: ObjectStore) -> None:
    """Fencing does not rest on clocks: a writer that missed the check still cannot commit a place the
    new holder committed, and its manifest never says Offloaded."""
    meta = MetadataStore(ScopedStore(store, "prefix"))
    new = write_segment(meta, 0, [5], publish_last=NOW, epoch=2)
    with pytest.raises(CommitConflictError, match=r"already committed by segment .*epoch 2.*refused"):
        write_segment(meta, 0, [5], publish_last=NOW + 1, epoch=1)
    [readable] = meta.offloaded_segments(new.topic)
    assert readable.uidMsb == new.uidMsb and readable.uidLsb == new.uidLsb


# -- who an instance is -------------------------------------------------------------------------------------

ELSEWHERE = Process(pid=4_000_000, space="another-boot/pid:[1]", started=123)
"""A process of another PID namespace (another container on the host): its pid says nothing here."""


def gone_here() -> Process:
    """A process of this PID namespace that is not running (no process has its pid and start time)."""
    me = Process.this()
    if not me.space:
        pytest.skip("no /proc: a process's liveness cannot be proved here")
    return Process(pid=me.pid, space=me.space, started=me.started + 1)


def test_replicas_with_the_same_host_and_path_do_not_take_each_others_live_lease(store: ObjectStore) -> None:
    """Two containers with one host name and checkpoint path used to be one holder id, and took each other's
    lease at once, over and over."""
    one = instance_id("/checkpoints/job", host="replica", token="aaaa")
    two = instance_id("/checkpoints/job", host="replica", token="bbbb")
    assert one != two and one.startswith("replica-") and two.startswith("replica-")
    for other in (Process.this(), ELSEWHERE):  # alive here, or in a space where nothing is proved
        fresh = ScopedStore(store, f"prefix-{other.pid}")
        first = WriterLease(fresh, one, ttl_ms=TTL_MS, process=other)
        assert first.acquire(now_ms=NOW).epoch == 1
        with pytest.raises(LeaseHeldError, match=f"instance {one} "):
            WriterLease(fresh, two, ttl_ms=TTL_MS).acquire(now_ms=NOW + 1)
        first.check()  # not fenced
        assert WriterLease(fresh, two, ttl_ms=TTL_MS).acquire(now_ms=NOW + TTL_MS).epoch == 2  # expired


def test_a_restart_after_a_crash_takes_its_lease_at_once(store: ObjectStore) -> None:
    """A new process on the same host and path, where the lease's process is provably gone, is its restart."""
    crashed = WriterLease(
        ScopedStore(store, "prefix"), instance_id("/cp", host="h", token="aaaa"), ttl_ms=TTL_MS, process=gone_here()
    )
    crashed.acquire(now_ms=NOW)
    with pytest.raises(LeaseHeldError):  # another path: another instance, which waits
        lease(store, instance_id("/other", host="h", token="bbbb")).acquire(now_ms=NOW + 1)
    restart = lease(store, instance_id("/cp", host="h", token="cccc"))
    assert restart.acquire(now_ms=NOW + 2).epoch == 2
    with pytest.raises(FencedError):
        crashed.check()


def test_a_malformed_lease_record_is_one_error_naming_it(store: ObjectStore) -> None:
    first = lease(store, "host-a")
    first.acquire(now_ms=NOW)
    key = keys.prefix_meta_prefix("prefix", "writers") + f"{1:020d}"
    for data, why in [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"holder": "x"}).encode(), "no 'epoch'"),
        (first.record.encode().replace(b'"epoch": 1', b'"epoch": "1"'), "'epoch' is '1', not an integer"),  # type: ignore[union-attr]
    ]:
        store.put(key, data)
        with pytest.raises(FormatError, match=f"^{key}: not a writer lease record.*{why}") as err:
            lease(store, "host-b").acquire(now_ms=NOW + 1)
        assert "--take-over" in str(err.value)
    assert lease(store, "host-b").acquire(force=True, now_ms=NOW + 1).epoch == 2  # past it
    with pytest.raises(FencedError, match=r"epoch 1\) was taken over"):
        first.check()
    store.put(keys.prefix_meta_prefix("prefix", "writers") + "stray", b"")  # not an epoch: not the lease's
    assert lease(store, "host-b").current().epoch == 2  # type: ignore[union-attr]


def test_a_new_process_after_the_holder_was_killed_takes_the_lease_at_once(
    fs_store: ObjectStore, tmp_path: Path
) -> None:
    """Across real processes: the crash sweep restarts `run --once` right after a SIGKILL."""
    root = tmp_path  # the fs_store's root
    code = (
        "import os, signal, sys\n"
        "from streamoffload.checkpoints.lease import WriterLease, instance_id\n"
        "from streamoffload.storage.filesystem import FilesystemStore\n"
        "from streamoffload.storage.location import ScopedStore\n"
        f"scoped = ScopedStore(FilesystemStore({str(root)!r}), 'prefix')\n"
        "lease = WriterLease(scoped, instance_id('/cp'), ttl_ms=600_000)\n"
        "lease.acquire()\n"
        "print(lease.holder, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    killed = done.stdout.strip()
    restart = WriterLease(ScopedStore(fs_store, "prefix"), instance_id("/cp"), ttl_ms=TTL_MS)
    assert restart.holder != killed and restart.holder.rsplit("-", 1)[0] == killed.rsplit("-", 1)[0]
    if not restart.process.space:
        with pytest.raises(LeaseHeldError):  # nothing proves the holder gone here: it waits
            restart.acquire()
        return
    assert restart.acquire().epoch == 2  # live for ten more minutes, but its process is gone
    with pytest.raises(LeaseHeldError, match=restart.holder):  # another path still waits
        WriterLease(ScopedStore(fs_store, "prefix"), instance_id("/other")).acquire()


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("ttl_ms", 2**70, rf"'ttl_ms' is {2**70}, outside 0\.\.253402300799999"),
        ("renewed_ms", -1, r"'renewed_ms' is -1, outside 0\.\.253402300799999"),
        ("epoch", 2**64, rf"'epoch' is {2**64}, outside 0\.\.{2**63 - 1}"),
        ("ttl_ms", 253_402_300_799_999, r"it expires at \d+ ms \(renewed_ms \+ ttl_ms\), after 253402300799999"),
    ],
)
def test_a_lease_records_numbers_are_range_checked_before_cleanup_or_a_writer_uses_them(
    store: ObjectStore, name: str, value: int, why: str
) -> None:
    """A time past what ``time.gmtime`` takes once reached the error text of ``cleanup`` as a raw OSError
    (EOVERFLOW): the record is refused where it is decoded, naming it."""
    first = lease(store, "host-a")
    first.acquire(now_ms=NOW)
    key = keys.prefix_meta_prefix("prefix", "writers") + f"{1:020d}"
    doc = json.loads(store.get(key))
    doc[name] = value
    store.put(key, json.dumps(doc).encode())
    with pytest.raises(FormatError, match=f"^{key}: not a writer lease record: {why}$"):
        lease(store, "host-b").current()
    with pytest.raises(FormatError, match=f"^{key}: not a writer lease record: {why}"):
        MetadataStore(ScopedStore(store, "prefix")).cleanup(TOPIC, grace_ms=0, at_ms=NOW + 1)
