"""What a Spark master string says about where the job's tasks run: the settings the session makes
(``streaming/job/session.py``) and the spool (``streaming/job/queries.py``) depend on it.

Three kinds: ``local`` (``local``, ``local[n]``, ``local[*]``, ``local[n,f]``: driver and tasks in one JVM),
``local-cluster`` (``local-cluster[N,C,M]``: Spark's test cluster, N executor JVMs on this machine) and
``cluster`` (``spark://``, ``yarn``, ``k8s://``, anything else: executors on other machines).
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass

from streamoffload.errors import StreamOffloadError


class MasterKind(enum.Enum):
    LOCAL = "local"
    LOCAL_CLUSTER = "local-cluster"
    CLUSTER = "cluster"


_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


@dataclass(frozen=True)
class Master:
    url: str
    kind: MasterKind
    cores: int | None
    """The cores the master string itself gives the job's tasks (``local[n]``: n; ``local[*]``: this machine's;
    ``local-cluster[N,C,M]``: N x C); None for a cluster manager, where the executors say."""

    @property
    def on_this_machine(self) -> bool:
        """Every task runs on this machine (``local`` and ``local-cluster``): files beside the checkpoint (the
        spool, the rate limits' shared budget) reach every task, and the driver's Python is every worker's."""
        return self.kind is not MasterKind.CLUSTER

    @property
    def single_jvm(self) -> bool:
        """Driver and tasks share one JVM (``local``): the driver's JVM options are the tasks'."""
        return self.kind is MasterKind.LOCAL


def parse_master(url: str) -> Master:
    """The kind of ``url`` (see the module); a ``local...`` string that is neither form is refused, naming it."""
    text = url.strip()
    if text.startswith("local"):
        local = _LOCAL.match(text)
        if local is not None:
            threads = local.group(1)
            cores = 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else int(threads)
            return Master(text, MasterKind.LOCAL, max(1, cores))
        cluster = _LOCAL_CLUSTER.match(text)
        if cluster is not None:
            return Master(text, MasterKind.LOCAL_CLUSTER, max(1, int(cluster.group(1)) * int(cluster.group(2))))
        raise StreamOffloadError(
            f"Spark master {url!r}: expected local, local[n], local[*], local[n,f] or local-cluster[N,C,M]"
        )
    return Master(text, MasterKind.CLUSTER, None)
