"""Small JSON files the job's driver writes for the Pulsar source, which runs in another process (Spark's
Python source runner): the policy versions in force (``streaming.governance.policy_versions``), the topics set
aside (``streaming.governance.quarantine``) and the offload buffers (``streaming.source.admission``); and the one
the source writes for dashboards in other processes (``streaming.source.backlog``). Written atomically; read
again only when they change."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from streamoffload.errors import StreamOffloadError

log = logging.getLogger(__name__)

T = TypeVar("T")


def write_json_file(path: str, doc: Any, *, temp_prefix: str) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (a temporary file beside it, then a rename)."""
    write_text_file(path, json.dumps(doc, sort_keys=True), temp_prefix=temp_prefix)


def write_text_file(path: str, text: str, *, temp_prefix: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename); ``mode``: its
    permissions, set before the rename (the temporary file is private, 0600)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a half-written temporary file must not pile up
            os.unlink(tmp)
        raise


class WatchedJsonFile(Generic[T]):
    """``parse`` of a JSON file, read again when its modification time or size changes. Missing: the last
    value (``empty`` at first); unreadable: the last value, with a warning naming ``what``."""

    def __init__(self, path: str, parse: Callable[[Any], T], empty: T, what: str) -> None:
        self.path = path
        self._parse = parse
        self._value = empty
        self._what = what
        self._stamp: tuple[int, int] | None = None

    def current(self) -> T:
        try:
            st = os.stat(self.path)
        except OSError:
            return self._value
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="utf-8") as fh:
                    self._value = self._parse(json.load(fh))
                self._stamp = stamp
            except (OSError, ValueError, TypeError, AttributeError, StreamOffloadError) as err:
                log.warning("cannot read %s from %s: %s", self._what, self.path, err)
        return self._value
