"""The fault kinds of a mixed chaos run (bench/chaos.py ``--faults``), and a seeded plan of them.

Kinds, and what the harness does for each:

- ``job-kill``: SIGKILL the job's process group after it made progress, restart it at once;
- ``job-kill-startup``: kill it, restart it, kill it again 2-8 s into its start-up (before Spark runs a
  batch), restart it;
- ``job-kill-commit``: arm the running job's crash point (``streaming.runtime.faults.CRASH_ARM``), so that it
  SIGKILLs its whole process group in the middle of its next segment commit (mid-upload, between data object
  and index, or between index and manifest), then restart it;
- ``broker-kill``: SIGKILL the pulsar-lite broker, restart it 0.5-4 s later on the same data directory and
  port (the producer and the job reconnect);
- ``disk-full`` (filesystem store): every write to the store fails with ENOSPC for 2-10 s
  (``storage.filesystem.DISK_FULL_FLAG_ENV``), then space is back;
- ``s3-500``, ``s3-503``, ``s3-reset``, ``s3-hang``, ``s3-delay`` (S3 store): the fault proxy in front of
  moto (bench/s3_fault_proxy.py) answers a share of the requests with that fault for 3-10 s;
- ``checkpoint-delete``: kill the job, delete Spark's checkpoint directory, restart;
- ``policy-live``: rewrite the configuration's offload policy while the job runs;
- ``policy-offline``: kill the job, rewrite the policy, restart.
"""

from __future__ import annotations

import random

COMMON_KINDS = (
    "job-kill",
    "job-kill-startup",
    "job-kill-commit",
    "broker-kill",
    "checkpoint-delete",
    "policy-live",
    "policy-offline",
)
FS_KINDS = ("disk-full",)
S3_KINDS = ("s3-500", "s3-503", "s3-reset", "s3-hang", "s3-delay")
KILL_KINDS = ("job-kill", "job-kill-startup", "checkpoint-delete", "policy-offline", "policy-live")
"""What ``--kills N`` runs: the original chaos run (job kills with policy edits and checkpoint deletions)."""

WEIGHTS = {
    # Cheap faults (no Spark start-up to wait for) are drawn more often, so a hundred fit in half an hour.
    "broker-kill": 3,
    "disk-full": 3,
    "s3-500": 1,
    "s3-503": 1,
    "s3-reset": 1,
    "s3-hang": 1,
    "s3-delay": 1,
    "policy-live": 2,
    "job-kill": 2,
    "job-kill-startup": 1,
    "job-kill-commit": 1,
    "checkpoint-delete": 1,
    "policy-offline": 1,
}
CRASH_POINTS = ("after-part", "after-complete", "after-index")
"""Where ``job-kill-commit`` crashes a segment's commit (streaming.runtime.faults.POINTS, the ones inside a seal)."""

AFTER_PROGRESS = frozenset({"job-kill", "job-kill-commit"})
"""Kinds that need a job that is offloading (a kill after progress, a kill inside a commit)."""


def kinds_for(store: str) -> tuple[str, ...]:
    return COMMON_KINDS + (FS_KINDS if store == "fs" else S3_KINDS)


def plan_faults(rng: random.Random, count: int, kinds: tuple[str, ...]) -> list[str]:
    """``count`` fault kinds in a seeded random order: every kind at least once when ``count`` allows it, the
    rest drawn by ``WEIGHTS``."""
    unknown = sorted(set(kinds) - set(WEIGHTS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(WEIGHTS)}")
    plan = list(kinds)[:count]
    rng.shuffle(plan)
    weights = [WEIGHTS[k] for k in kinds]
    plan += rng.choices(kinds, weights=weights, k=count - len(plan))
    # Keep the every-kind-once part spread over the run, not bunched at its start.
    rng.shuffle(plan)
    return plan
