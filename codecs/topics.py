"""Pulsar topic names: ``{persistent|non-persistent}://tenant/namespace/local-name[-partition-N]``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamoffload.codecs.errors import CodecError

PARTITION_SUFFIX = "-partition-"
_PARTITION_RE = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")


class TopicNameError(CodecError, ValueError):
    """A string that is not a valid Pulsar topic name."""


@dataclass(frozen=True, order=True)
class TopicName:
    """A parsed topic (or topic-partition) name.

    ``partition`` is the partition index for ``...-partition-N`` names and -1 otherwise, matching
    Pulsar's ``TopicName.getPartitionIndex()``.
    """

    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse a full name, or a short one (``my-topic`` means ``persistent://public/default/my-topic``,
        ``tenant/ns/topic`` means ``persistent://tenant/ns/topic``), as Pulsar does."""
        text = name.strip()
        if not text:
            raise TopicNameError("empty topic name")
        domain = "persistent"
        if "://" in text:
            domain, _, text = text.partition("://")
            if domain not in ("persistent", "non-persistent"):
                raise TopicNameError(f"topic {name!r}: domain must be persistent or non-persistent, not {domain!r}")
        parts = text.split("/")
        if len(parts) == 1:
            tenant, namespace, local = "public", "default", parts[0]
        elif len(parts) == 3:
            tenant, namespace, local = parts
        else:
            raise TopicNameError(
                f"topic {name!r}: expected persistent://tenant/namespace/topic or a short name, "
                f"got {len(parts)} '/'-separated parts"
            )
        for label, value in (("tenant", tenant), ("namespace", namespace), ("topic", local)):
            if not value:
                raise TopicNameError(f"topic {name!r}: empty {label}")
        return cls(domain, tenant, namespace, local)

    @property
    def partition(self) -> int:
        match = _PARTITION_RE.match(self.local_name)
        return int(match.group("index")) if match else -1

    @property
    def is_partition(self) -> bool:
        return self.partition >= 0

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        match = _PARTITION_RE.match(self.local_name)
        if not match:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, match.group("base"))

    def partition_name(self, index: int) -> TopicName:
        return TopicName(self.domain, self.tenant, self.namespace, f"{self.base.local_name}{PARTITION_SUFFIX}{index}")

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"
