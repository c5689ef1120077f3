"""The filesystem object store (the embedded default): key ``a/b/c`` is the file ``<root>/a/b/c``.

Every write goes to a temporary file in the target directory (made durable: an fsync, or a group ``syncfs``,
``storage/fs_sync.py``) and is renamed into place, so a reader sees the old object or the new one, never part of
one, even if the writer is killed. Names
starting with ``.`` belong to the store and never collide with keys (``check_key`` refuses them):

- ``.<name>.tmp-<random>``: a write in progress (left behind only by a crash; invisible to ``list``);
- ``.<name>.meta.json``: the object's user metadata, renamed into place before the object itself;
- ``<root>/.multipart/<upload-id>/``: a multipart upload's ``manifest.json``, its parts (placed in one file,
  ``object``, with a marker each, or ``part-NNNNN`` files: ``FilesystemMultipartWrite``) and its ``lock``;
- ``<root>/.locks/NN``: striped ``flock`` locks that order writers of the same key across processes.

Files are created with ``file_mode`` (0600 by default) and directories with ``dir_mode`` (0700), whatever
the umask: the store holds other people's messages. ``remove_stale_temporaries`` sweeps what killed
writers leave (temporary files, metadata files without their object, staging directories of uploads that
never got a manifest); ``streamoffload cleanup`` and the job's retention runner call it.

Metadata lives beside the object rather than in xattrs so that copying the directory tree (``cp -r``,
``rsync -a``) keeps it. The price: an overwrite that *changes* the metadata of an existing key is two
renames, so a concurrent ``head`` (or a crash between them) can pair the new metadata with the old
bytes. The offloader never does that (data and index objects get fresh UUID names, and manifests carry
no user metadata).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from streamoffload.storage.base import (
    Buffer,
    MultipartWrite,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    PartData,
    PendingUpload,
    RangedReader,
    StorageError,
    TransientStorageError,
    UploadNotFoundError,
    buffers_size,
    check_part_list,
    check_part_number,
    normalize_metadata,
    part_buffers,
)
from streamoffload.storage.fs_sync import SYNC_MODES, Syncer, syncer_for
from streamoffload.storage.keys import check_key, check_prefix
from streamoffload.storage.local_files import FileRangedReader, ReopeningFileReader, pread_exact

MULTIPART_DIR = ".multipart"
LOCKS_DIR = ".locks"
_LOCK_STRIPES = 64
_MANIFEST = "manifest.json"
_UPLOAD_LOCK = "lock"
_PLACED_OBJECT = "object"
_PLACED_RE = re.compile(r"^part-(\d{5})\.at-(\d+)-(\d+)$")
_UPLOAD_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_COPY_CHUNK = 8 * 1024 * 1024
_IOV_MAX = 1024
DEFAULT_FILE_MODE = 0o600
DEFAULT_DIR_MODE = 0o700
DISK_FULL_FLAG_ENV = "STREAMOFFLOAD_TEST_DISK_FULL_FLAG"
"""Tests and the chaos bench only (bench/chaos.py's full-disk fault, where no small tmpfs can be mounted):
while the file this names exists, every write to a filesystem store fails with ENOSPC, as on a full disk.
Unset (always, in production) this is one environment lookup per write."""


def _fail_if_disk_full(path: Path) -> None:
    flag = os.environ.get(DISK_FULL_FLAG_ENV)
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def dir_mode_for(file_mode: int) -> int:
    """The directory mode that goes with a file mode: each class that may read files may also enter
    directories (0600 -> 0700, 0640 -> 0750, 0644 -> 0755)."""
    mode = file_mode & 0o777
    for shift in (6, 3, 0):
        if mode & (0o4 << shift):
            mode |= 0o1 << shift
    return mode | 0o700


def check_mode(mode: int, what: str) -> int:
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise StorageError(f"{what} must be a permission mode between 0o000 and 0o777, got {mode!r}")
    if what == "file_mode" and mode & 0o600 != 0o600:
        raise StorageError(f"file_mode {mode:04o} must let the owner read and write (0600 at least)")
    if what == "dir_mode" and mode & 0o700 != 0o700:
        raise StorageError(f"dir_mode {mode:04o} must give the owner rwx (0700 at least)")
    return mode


def _write_chunks(f: object, chunks: Iterable[Buffer]) -> int:
    """Write ``chunks`` to the open binary file ``f``; return the byte count. (One function so that
    tests can stop a writer half-way, as a crash would.)"""
    total = 0
    for chunk in chunks:
        f.write(chunk)  # type: ignore[attr-defined]
        total += len(chunk)
    return total


def _copy_range(src: int, dst: int, size: int, start: int = 0) -> None:
    """Append ``size`` bytes of ``src`` from ``start`` to ``dst`` at its position, in the kernel."""
    offset = 0
    while offset < size:
        copied = os.copy_file_range(src, dst, min(size - offset, _COPY_CHUNK * 8), start + offset)
        if copied == 0:
            raise OSError(errno.EIO, f"copy_file_range stopped at {offset} of {size} bytes")
        offset += copied


def _pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """Write ``buffers`` one after another at ``offset``: ``os.pwritev`` (``IOV_MAX`` at a time), resumed after
    a short write."""
    views = [memoryview(b).cast("B") for b in buffers]
    i = 0
    while i < len(views):
        written = os.pwritev(fd, views[i : i + _IOV_MAX], offset)
        offset += written
        while i < len(views) and written >= views[i].nbytes:
            written -= views[i].nbytes
            i += 1
        if written:
            views[i] = views[i][written:]


class FilesystemStore(ObjectStore):
    """Objects as files under ``root``. ``fsync=False`` skips the fsyncs (tests, scratch data); ``sync``: how
    writes are made durable, ``"group"`` (one ``syncfs`` for the threads that wait at once, on Linux) or
    ``"file"`` (an ``fsync`` per file): ``storage/fs_sync.py``.

    ``file_mode``/``dir_mode``: permissions of the files and directories the store creates (exactly,
    whatever the umask); ``dir_mode`` defaults to the one that goes with ``file_mode`` (``dir_mode_for``).
    An existing root keeps its mode."""

    min_part_size = 1
    """Parts of any size."""
    part_size = 256 << 10
    """But a part here is a staged file with its fsyncs and a checksum record per block: sent every micro-batch,
    the many small ones of trickle traffic cost most of a micro-batch (bench/README, "Issue 24, session 37"). So
    the job gathers this much into a part, and a segment smaller than this is written whole at its seal."""
    copies_parts = False
    """A part's buffers go to its staged file as they are (``os.pwritev``)."""

    def __init__(
        self,
        root: str | Path,
        *,
        fsync: bool = True,
        sync: str = "group",
        file_mode: int = DEFAULT_FILE_MODE,
        dir_mode: int | None = None,
    ) -> None:
        self._root = Path(os.path.abspath(os.fspath(root)))
        self._fsync = fsync
        if sync not in SYNC_MODES:
            raise StorageError(f"filesystem store {self._root}: sync {sync!r} is not one of {', '.join(SYNC_MODES)}")
        self._sync_mode = sync
        self._syncer_of: tuple[int, Syncer] | None = None
        self.file_mode = check_mode(file_mode, "file_mode")
        self.dir_mode = check_mode(dir_mode_for(file_mode) if dir_mode is None else dir_mode, "dir_mode")
        try:
            if not self._root.is_dir():
                self._root.mkdir(parents=True, exist_ok=True, mode=self.dir_mode)
                os.chmod(self._root, self.dir_mode)
        except OSError as exc:
            raise StorageError(f"cannot create filesystem store root {self._root}: {exc.strerror}") from exc
        if not self._root.is_dir():
            raise StorageError(f"filesystem store root {self._root} is not a directory")

    # --- ObjectStore ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._root.as_uri()

    @property
    def root(self) -> Path:
        return self._root

    def __repr__(self) -> str:
        return (
            f"FilesystemStore({str(self._root)!r}, fsync={self._fsync}, sync={self._sync_mode!r}, "
            f"file_mode=0o{self.file_mode:03o})"
        )

    def __getstate__(self) -> dict[str, object]:
        # A store goes to Spark's tasks pickled: its syncer (a lock, a descriptor) is this process's, not theirs.
        return {**self.__dict__, "_syncer_of": None}

    def _syncer(self) -> Syncer:
        """This process's way to make writes durable (looked up again in a forked child)."""
        pid = os.getpid()
        if self._syncer_of is None or self._syncer_of[0] != pid:
            self._syncer_of = (pid, syncer_for(self._root, self._sync_mode))
        return self._syncer_of[1]

    def put(
        self,
        key: str,
        data: bytes | memoryview,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        path = self._path(key)
        meta = normalize_metadata(metadata)
        with self._errors("put", key, path):
            if if_absent and self._is_object(path):
                raise ObjectExistsError(key)  # cheap early exit; the check that counts is in _publish
            tmp = self._write_temp(path, [data])
            try:
                self._publish(key, path, tmp, meta, if_absent=if_absent)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            st = path.stat()
        return ObjectInfo(key, st.st_size, meta, st.st_mtime)

    def put_many(self, objects: Sequence[tuple[str, bytes | memoryview, Mapping[str, str] | None]]) -> None:
        """Every object (and its metadata file) written and renamed into place first, then all of them and their
        directories made durable at once (one group ``syncfs``, or each fsynced): durable, all of them, when this
        returns. Nothing reads them before the commit that follows (a segment's records, data and index; a crash
        before the end leaves objects a replay writes again), so their order among themselves does not matter."""
        directories: dict[Path, None] = {}
        written: list[Path] = []
        for key, data, metadata in objects:
            path = self._path(key)
            with self._errors("put", key, path):
                tmp = self._write_temp(path, [data], durable=False)
                try:
                    meta = normalize_metadata(metadata)
                    self._publish(key, path, tmp, meta, if_absent=False, sync=False, durable=False)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
            written.append(path)
            if meta:
                written.append(self._sidecar(path))
            directories[path.parent] = None
        if self._fsync and written:
            with self._errors("put", objects[0][0], written[0]):
                self._syncer().paths([*written, *directories])

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors("get", key, path), self._open_object(key, path) as f:
            return f.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"get_range({key!r}, {start}, {length}): start and length must be >= 0")
        path = self._path(key)
        with self._errors("get_range", key, path), self._open_object(key, path) as f:
            return pread_exact(f.fileno(), start, length)

    def open_ranged_reader(self, key: str, *, hold_open: bool = True) -> RangedReader:
        """Ranged reads of one object through a single held descriptor (``FileRangedReader``); with
        ``hold_open=False``, through ``get_range`` (each read opens the file as it is then)."""
        return FileRangedReader(self, key, self.root) if hold_open else ReopeningFileReader(self, key)

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with self._errors("head", key, path):
            try:
                st = path.stat()
            except (FileNotFoundError, NotADirectoryError):
                raise ObjectNotFoundError(key, self.url) from None
            if not path.is_file():
                raise ObjectNotFoundError(key, self.url)
            return ObjectInfo(key, st.st_size, self._read_sidecar(path), st.st_mtime)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        head, _, partial = prefix.rpartition("/")
        start_dir = self._root / head if head else self._root
        key_prefix = head + "/" if head else ""
        return self._walk(start_dir, key_prefix, partial)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._errors("delete", key, path), self._lock(key):
            removed = False
            try:
                os.unlink(path)
                removed = True
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass  # absent (a directory is not an object): deleting is a no-op, as on S3
            except PermissionError:
                if not path.is_dir():  # macOS reports EPERM for unlink of a directory
                    raise
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(self._sidecar(path))
                removed = True
            if removed and self._fsync:  # deleting nothing needs no sync (the sink clears absent keys often)
                self._fsync_dir(path.parent)
            self._prune(path.parent)

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        check_key(key)
        meta = normalize_metadata(metadata)
        upload_id = uuid.uuid4().hex
        staging = self._staging(upload_id)
        with self._errors("start_multipart", key, staging):
            parent = self._ensure_dir(staging.parent)
            self._mkdir(staging)
            manifest = {"key": key, "metadata": meta, "initiated": time.time()}
            tmp = self._write_temp(staging / _MANIFEST, [json.dumps(manifest).encode()])
            os.replace(tmp, staging / _MANIFEST)
            if self._fsync:
                self._fsync_dir(staging)
                self._fsync_dir(parent)
        return FilesystemMultipartWrite(self, key, upload_id, meta)

    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        check_key(key)
        manifest = self._read_manifest(upload_id)
        if manifest is None or manifest.get("key") != key:
            raise UploadNotFoundError(key, upload_id, self.url)
        metadata = manifest.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise StorageError(f"{self.url}: the multipart manifest of upload {upload_id} has metadata {metadata!r}")
        return FilesystemMultipartWrite(self, key, upload_id, {str(k): str(v) for k, v in metadata.items()})

    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        check_prefix(prefix)
        found: list[PendingUpload] = []
        try:
            entries = list(os.scandir(self._root / MULTIPART_DIR))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            manifest = self._read_manifest(entry.name)
            if manifest is None:
                continue  # a start_multipart that crashed before its manifest: never handed out
            key = manifest.get("key")
            if isinstance(key, str) and key.startswith(prefix):
                initiated = manifest.get("initiated", 0.0)
                found.append(
                    PendingUpload(key, entry.name, float(initiated) if isinstance(initiated, int | float) else 0.0)
                )
        found.sort(key=lambda p: (p.key, p.initiated, p.upload_id))
        return iter(found)

    def remove_stale_temporaries(self, older_than: float = 3600.0) -> int:
        """Delete what writers killed mid-write left behind, untouched for ``older_than`` seconds; return
        how many files and directories were removed:

        - temporary files ``.<name>.tmp-*`` (also in multipart staging);
        - metadata files ``.<name>.meta.json`` whose object does not exist (a put killed between the two
          renames);
        - multipart staging directories without a manifest (a ``start_multipart`` killed before writing
          it: such an upload was never handed out, so nobody can complete or abort it);
        - directories left empty by the above.

        Uploads that have a manifest are left to ``MetadataStore.cleanup``, which knows whether a segment
        still needs them. A live writer keeps its temporary file for as long as one write takes, so keep
        ``older_than`` well above that. The sweep walks the whole tree: run it rarely."""
        cutoff = time.time() - older_than
        removed = 0
        staging_root = self._root / MULTIPART_DIR
        try:
            uploads = list(os.scandir(staging_root))
        except FileNotFoundError:
            uploads = []
        for entry in uploads:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                if not entry.is_dir(follow_symlinks=False) or os.path.exists(os.path.join(entry.path, _MANIFEST)):
                    continue
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    shutil.rmtree(entry.path)
                    removed += 1
        for dirpath, dirnames, filenames in os.walk(self._root):
            dirnames[:] = [d for d in dirnames if d != LOCKS_DIR]
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name.startswith(".") and ".tmp-" in name:
                    stale = True
                elif name.startswith(".") and name.endswith(".meta.json") and dirpath != str(staging_root):
                    stale = not os.path.lexists(os.path.join(dirpath, name[1 : -len(".meta.json")]))
                else:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if stale and os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
        return removed

    # --- internals -----------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))

    @staticmethod
    def _sidecar(path: Path) -> Path:
        return path.with_name(f".{path.name}.meta.json")

    def _staging(self, upload_id: str) -> Path:
        return self._root / MULTIPART_DIR / upload_id

    @staticmethod
    def _is_object(path: Path) -> bool:
        try:
            return path.is_file()
        except OSError:
            return False

    @contextlib.contextmanager
    def _errors(self, op: str, key: str, path: Path) -> Iterator[None]:
        """Turn OS errors into StorageErrors that name the store, the operation, the key and the file."""
        try:
            yield
        except StorageError:
            raise
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise StorageError(
                f"{self.url}: {op} {key!r}: a key cannot be both an object and a prefix of other keys "
                f"on a filesystem store ({exc.strerror}: {exc.filename})"
            ) from exc
        except OSError as exc:
            raise TransientStorageError(
                f"{self.url}: {op} {key!r} failed: {exc.strerror or exc} ({exc.filename or path})"
            ) from exc

    @contextlib.contextmanager
    def _open_object(self, key: str, path: Path) -> Iterator[io.FileIO]:
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(key, self.url) from None
        except PermissionError:
            if path.is_dir():
                raise ObjectNotFoundError(key, self.url) from None
            raise
        with f:
            yield f

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        """Serialise writers of ``key`` (threads and processes on this host): the sidecar and the object
        are renamed as a pair, and ``if_absent`` checks and creates under the same lock."""
        stripe = zlib.crc32(key.encode("utf-8")) % _LOCK_STRIPES
        lock_dir = self._root / LOCKS_DIR
        if not lock_dir.is_dir():
            with contextlib.suppress(FileExistsError):
                self._mkdir(lock_dir)
        fd = os.open(lock_dir / f"{stripe:02d}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _create(self, path: Path, flags: int = os.O_WRONLY) -> int:
        """Open ``path``, created with exactly ``file_mode`` (whatever the umask) if it is new."""
        fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, self.file_mode)
        try:
            os.fchmod(fd, self.file_mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _ensure_dir(self, directory: Path) -> Path:
        """Create ``directory`` (and missing parents), fsyncing each parent that gained an entry."""
        missing: list[Path] = []
        current = directory
        while not current.is_dir():
            missing.append(current)
            if current == self._root or current.parent == current:
                break
            current = current.parent
        for new in reversed(missing):
            try:
                self._mkdir(new)
            except FileExistsError:
                if not new.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, "an object is in the way", str(new)) from None
                continue
            if self._fsync:
                self._fsync_dir(new.parent)
        return directory

    def _write_temp(
        self,
        path: Path,
        chunks: Iterable[Buffer] | Callable[[BinaryIO], object],
        *,
        create_dirs: bool = True,
        durable: bool = True,
    ) -> Path:
        """Write ``chunks`` (or let the callable fill the open file) to a fresh temporary file beside ``path``,
        fsynced (unless not ``durable``); return its path. The file is removed if writing fails."""
        _fail_if_disk_full(path)
        for attempt in range(5):
            if create_dirs:
                self._ensure_dir(path.parent)
            tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, self.file_mode)
            except FileNotFoundError:
                if attempt == 4 or not create_dirs:
                    raise
                continue  # a concurrent delete pruned the (empty) directory: create it again
            break
        try:
            os.fchmod(fd, self.file_mode)  # exactly the mode asked for, whatever the umask
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            with open(fd, "wb", closefd=True) as f:
                if callable(chunks):
                    chunks(f)
                else:
                    _write_chunks(f, chunks)
                f.flush()
                if self._fsync and durable:
                    self._syncer().descriptor(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def _publish(
        self,
        key: str,
        path: Path,
        tmp: Path,
        meta: dict[str, str],
        *,
        if_absent: bool,
        sync: bool = True,
        durable: bool = True,
    ) -> None:
        """Make the written temporary file the object ``key``: metadata first, then the bytes (``sync``: each
        durable in its directory before the next step; else the caller syncs the directory; ``durable``: the
        metadata file's bytes fsynced, else the caller fsyncs it)."""
        with self._lock(key):
            if if_absent and self._is_object(path):
                raise ObjectExistsError(key)
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "keys exist below this one", str(path))
            self._write_sidecar(path, meta, sync=sync, durable=durable)
            if if_absent:
                try:
                    # link() fails if the name exists: atomic even against writers that skip our lock
                    # (another host on a shared filesystem).
                    os.link(tmp, path)
                except FileExistsError:
                    raise ObjectExistsError(key) from None
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
            if self._fsync and sync:
                self._fsync_dir(path.parent)

    def _write_sidecar(self, path: Path, meta: dict[str, str], *, sync: bool = True, durable: bool = True) -> None:
        sidecar = self._sidecar(path)
        current = self._read_sidecar(path)
        if current == meta:
            return
        if not meta:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sidecar)
        else:
            tmp = self._write_temp(sidecar, [json.dumps({"metadata": meta}, sort_keys=True).encode()], durable=durable)
            os.replace(tmp, sidecar)
        if self._fsync and sync:
            self._fsync_dir(path.parent)  # the metadata is durable before the object appears

    def _read_sidecar(self, path: Path) -> dict[str, str]:
        try:
            raw = self._sidecar(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        try:
            meta = json.loads(raw)["metadata"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{self.url}: unreadable metadata file {self._sidecar(path)}: {exc}") from exc
        return {str(k): str(v) for k, v in meta.items()}

    def _read_manifest(self, upload_id: str) -> dict[str, object] | None:
        if not _UPLOAD_ID_RE.match(upload_id):
            return None
        try:
            raw = (self._staging(upload_id) / _MANIFEST).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            manifest = json.loads(raw)
        except ValueError as exc:
            raise StorageError(f"{self.url}: unreadable multipart manifest of upload {upload_id}: {exc}") from exc
        return manifest if isinstance(manifest, dict) else None

    def _walk(self, directory: Path, key_prefix: str, name_prefix: str) -> Iterator[ObjectInfo]:
        """Objects below ``directory`` in key order: entries sorted by name, a directory ``d`` as ``d/``
        (every key below it starts with ``d/``), so the walk yields keys in plain string order."""
        try:
            with os.scandir(directory) as it:
                entries = [e for e in it if not e.name.startswith(".") and e.name.startswith(name_prefix)]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StorageError(f"{self.url}: list {key_prefix!r}: {exc.strerror} ({directory})") from exc
        ordered = sorted(((e.name + "/" if e.is_dir(follow_symlinks=False) else e.name), e) for e in entries)
        for sort_name, entry in ordered:
            if sort_name.endswith("/"):
                yield from self._walk(Path(entry.path), key_prefix + entry.name + "/", "")
                continue
            try:
                if not entry.is_file():
                    continue
                st = entry.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            yield ObjectInfo(key_prefix + entry.name, st.st_size, {}, st.st_mtime)

    def _prune(self, directory: Path) -> None:
        """Remove directories left empty by a delete, up to (not including) the root."""
        current = directory
        while current != self._root and self._root in current.parents:
            try:
                current.rmdir()
            except OSError:
                return  # not empty (or already gone): stop
            current = current.parent

    def _mkdir(self, directory: Path) -> None:
        """Create one directory with ``dir_mode`` exactly (``FileExistsError`` if it exists)."""
        directory.mkdir(mode=self.dir_mode)
        os.chmod(directory, self.dir_mode)

    def _fsync_dir(self, directory: Path) -> None:
        self._syncer().paths([directory])


class FilesystemMultipartWrite(MultipartWrite):
    """A multipart upload staged under ``<root>/.multipart/<upload-id>/``.

    Parts written in order (the offloader's way: part n after parts 1..n-1) are **placed**: written at their
    offset into one staging file, ``object``, with an empty marker ``part-NNNNN.at-<offset>-<size>`` created
    after the bytes, so ``complete`` of parts 1..k hard-links that file as the object instead of copying every
    byte once more (a copy into new page-cache pages cost ~2.5 CPU s per GB on this machine's kernel). Any
    other part (out of order, or a rewrite of a placed part) is a ``part-NNNNN`` file of its own, written to a
    temporary name and renamed, and ``complete`` then copies ranges and files into the object. Either way a
    part exists only once it is whole: a placed part once its marker exists (a write killed before it leaves
    bytes past the placed ones, which the next placed part overwrites and ``complete`` truncates), a rewrite
    by its rename; so a rewrite never tears a part ``complete`` may use. A lock file serialises the upload's
    writers across processes."""

    def __init__(self, store: FilesystemStore, key: str, upload_id: str, metadata: dict[str, str]) -> None:
        self.key = key
        self.upload_id = upload_id
        self._store = store
        self._metadata = metadata
        self._staging = store._staging(upload_id)

    def __repr__(self) -> str:
        return f"FilesystemMultipartWrite(key={self.key!r}, upload_id={self.upload_id!r}, store={self._store.url!r})"

    def _part(self, number: int) -> Path:
        return self._staging / f"part-{number:05d}"

    def _check_alive(self) -> None:
        if not (self._staging / _MANIFEST).is_file():
            raise UploadNotFoundError(self.key, self.upload_id, self._store.url)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            fd = self._store._create(self._staging / _UPLOAD_LOCK, os.O_RDWR)
        except (FileNotFoundError, NotADirectoryError):
            raise UploadNotFoundError(self.key, self.upload_id, self._store.url) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._check_alive()
            yield
        finally:
            os.close(fd)

    def _placed(self) -> dict[int, tuple[int, int, str]]:
        """The placed parts: number -> (offset, size, marker name)."""
        placed: dict[int, tuple[int, int, str]] = {}
        for entry in os.scandir(self._staging):
            found = _PLACED_RE.match(entry.name)
            if found:
                placed[int(found[1])] = (int(found[2]), int(found[3]), entry.name)
        return placed

    def write_part(self, part_number: int, data: PartData) -> None:
        check_part_number(part_number)
        store = self._store
        part = self._part(part_number)
        buffers = part_buffers(data)
        size = buffers_size(buffers)
        with store._errors(f"write_part {part_number} of", self.key, part), self._locked():
            _fail_if_disk_full(part)
            placed = self._placed()
            # Not fsynced: a part is read back only by ``complete``, which fsyncs the object it makes before
            # publishing it. A part lost to an OS crash is never used: the crash ends the job's run, and the
            # next run abandons every attempt it did not commit (S3 parts are not durable objects either).
            if part_number not in placed and sorted(placed) == list(range(1, part_number)) and not part.exists():
                offset = max((o + n for o, n, _ in placed.values()), default=0)
                fd = store._create(self._staging / _PLACED_OBJECT)
                try:
                    _pwritev_all(fd, buffers, offset)
                finally:
                    os.close(fd)
                os.close(store._create(self._staging / f"part-{part_number:05d}.at-{offset}-{size}"))
                return
            tmp_path = store._write_temp(part, buffers, create_dirs=False, durable=False)
            os.replace(tmp_path, part)  # a rewritten part replaces the old one atomically
            if part_number in placed:
                os.unlink(self._staging / placed[part_number][2])  # the file is the part now

    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo:
        numbers = check_part_list(part_numbers)
        store = self._store
        path = store._path(self.key)
        with store._errors("complete", self.key, path), self._locked():
            placed = self._placed()
            missing = [n for n in numbers if n not in placed and not self._part(n).is_file()]
            if missing:
                raise StorageError(
                    f"{store.url}: complete {self.key!r} (upload {self.upload_id}): parts {missing} were never "
                    f"written; written parts are {self._written_parts()}"
                )
            tmp = self._assemble(path, numbers, placed)
            try:
                store._publish(self.key, path, tmp, self._metadata, if_absent=False)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            st = path.stat()
            shutil.rmtree(self._staging, ignore_errors=True)
        return ObjectInfo(self.key, st.st_size, dict(self._metadata), st.st_mtime)

    def abort(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)

    def _written_parts(self) -> list[int]:
        separate = {int(p.name[5:]) for p in self._staging.glob("part-[0-9]*") if p.name[5:].isdigit()}
        return sorted(separate | set(self._placed()))

    def _assemble(self, path: Path, numbers: list[int], placed: dict[int, tuple[int, int, str]]) -> Path:
        """The object's bytes in a temporary file beside ``path``, fsynced when the store fsyncs.

        Parts 1..k all placed in order: the staging ``object`` file, cut to their end, becomes the object by a
        hard link (no copy); likewise a lone separate part. Placed parts are never written again in place (a
        rewrite becomes a separate file), and the staging directory goes with ``complete``, so the object cannot
        change through the link. Otherwise the kernel copies each part's bytes (``copy_file_range``), without
        passing through Python. Both fall back to reading and writing where the filesystem refuses (no hard
        links, another device, an old kernel)."""
        store = self._store
        source: Path | None = None
        end = 0
        for number in numbers:
            where = placed.get(number)
            if where is None or where[0] != end:
                break
            end += where[1]
        else:
            if numbers == list(range(1, len(numbers) + 1)):
                source = self._staging / _PLACED_OBJECT
                os.truncate(source, end)  # bytes of a write killed before its marker, or of parts not listed
        if source is None and len(numbers) == 1 and numbers[0] not in placed:
            source = self._part(numbers[0])
        if source is not None:
            store._ensure_dir(path.parent)
            tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
            try:
                os.link(source, tmp)
            except OSError:
                pass
            else:
                # Young as a temporary file: a link has its source's modification time, however long ago the parts
                # were written, and ``remove_stale_temporaries`` goes by it.
                os.utime(tmp)
                if store._fsync:
                    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        store._syncer().descriptor(fd)
                        # Durable now, and read back seldom (an offloaded segment): its clean pages leave the page
                        # cache, so the next objects are written into pages the kernel just freed instead of
                        # growing the cache into memory never touched (costly on a VM: bench/page_cost.py).
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
                return tmp

        def copy_parts(out: BinaryIO) -> None:
            try:
                for src, offset, size in self._sources(numbers, placed):
                    with open(src, "rb", buffering=0) as part:
                        _copy_range(part.fileno(), out.fileno(), size, offset)
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                out.seek(0)
                out.truncate()
                _write_chunks(out, self._read_parts(numbers, placed))

        return store._write_temp(path, copy_parts)

    def _sources(self, numbers: list[int], placed: dict[int, tuple[int, int, str]]) -> Iterator[tuple[Path, int, int]]:
        """Where each part's bytes are: (file, offset, size)."""
        for number in numbers:
            if number in placed:
                offset, size, _ = placed[number]
                yield self._staging / _PLACED_OBJECT, offset, size
            else:
                part = self._part(number)
                yield part, 0, part.stat().st_size

    def _read_parts(self, numbers: list[int], placed: dict[int, tuple[int, int, str]]) -> Iterator[bytes]:
        for src, offset, size in self._sources(numbers, placed):
            with open(src, "rb", buffering=0) as f:
                f.seek(offset)
                left = size
                while left and (chunk := f.read(min(_COPY_CHUNK, left))):
                    left -= len(chunk)
                    yield chunk
