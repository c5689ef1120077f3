"""The commit protocol of a segment, in the order that makes it crash-safe (Aiven's upload recipe: the data, its
index, then the manifest last).

``open`` starts the multipart upload and writes the Assigned manifest recording its id (create-only: a replay
keeps to what was written first); the sink uploads numbered parts into that upload (``upload_for``; rewriting a
part is harmless: the same entries make the same bytes); ``seal`` completes the data object with the exact part
list, writes the index, checks the writer still holds the lease, and commits the segment create-only in its
place in the topic's history with the Offloaded manifest, last. A replayed micro-batch therefore converges on
the same objects, a reader never sees half a segment, and a fenced writer's commit is refused. No manifest is
ever read and then overwritten.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar
from urllib.parse import quote

from streamoffload import __version__
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import KeyRing, copy_encryption, encryption_key_id, with_new_data_key
from streamoffload.checkpoints.lease import COMMIT_WINDOW_MS, FencedError, check_epoch
from streamoffload.checkpoints.metadata_store import MetadataStore, delete_part_frames
from streamoffload.codecs.block_cipher import stored_length
from streamoffload.codecs.block_frames import Frame, PartFrames, encode_table, stored_size
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import MultipartWrite, ObjectNotFoundError
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.handoff.actions import SealAction
from streamoffload.streaming.runtime.faults import crash_point
from streamoffload.streaming.sink.at_rest import BlockEncoding, policy_compression_level, policy_key_id

MANAGED_LEDGER_KEY = "managedledgername"
SOFTWARE_VERSION_KEY = "streamoffloadversion"
SEGMENT_KEY = "streamoffloadsegment"


class ReplayMismatchError(StreamingError):
    """A replayed seal disagrees with the data object a failed attempt already completed."""


def managed_ledger_name(topic: str) -> str:
    """Pulsar's managed-ledger name of a topic-partition: ``tenant/namespace/persistent/local-name``."""
    name = TopicName.parse(topic)
    return f"{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"


def object_metadata(topic: str, segment: str) -> dict[str, str]:
    return {
        FORMAT_VERSION_METADATA_KEY: SUPPORTED_FORMAT_VERSION,
        # S3 metadata values are ASCII: a topic with other characters is percent-encoded here.
        MANAGED_LEDGER_KEY: quote(managed_ledger_name(topic), safe="/-._~"),
        SOFTWARE_VERSION_KEY: __version__,
        SEGMENT_KEY: segment,
    }


V = TypeVar("V")


class _Bounded(Generic[V]):
    """A small LRU map: per-executor caches must not grow with the number of segments ever written.
    Shared by the sink's threads (one per topic-partition at a time), hence the lock."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, key: str) -> V | None:
        with self._lock:
            return self._items.get(key)

    def pop(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items


class CommitWindowError(StreamingError, TimeoutError):
    """A seal whose commit would come later than ``COMMIT_WINDOW_MS`` after its first write: refused, so that what
    ``cleanup`` beside the job takes for orphans never gets a commit. A timeout of the writer, not of the topic:
    the run starts again and writes the segment again."""


class SegmentCommits:
    """One executor's side of the commit protocol, over a store: shared by the sink's threads (each
    topic-partition's segments are its own), with bounded caches of the uploads, encodings and completed data
    objects it knows of."""

    def __init__(
        self, scoped: ScopedStore, keyring: KeyRing | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``keyring``: the key-encryption keys of encrypted segments (default: the environment's,
        ``checkpoints.keyring``). ``clock``: seconds, for the commit window (``COMMIT_WINDOW_MS``)."""
        self.scoped = scoped
        self.store = scoped.store
        self.metadata = MetadataStore(scoped)
        self.keyring = keyring
        self.clock = clock
        self._uploads: _Bounded[MultipartWrite] = _Bounded()  # data key -> what its Assigned manifest recorded
        self._encodings: _Bounded[BlockEncoding] = _Bounded()  # data key -> its cipher and compression
        self._done: _Bounded[bool] = _Bounded()  # data keys whose object already exists (a replay after success)

    def forget_upload(self, data_key: str) -> None:
        """The segment ``data_key`` was written whole: no upload of it is wanted any more."""
        self._uploads.pop(data_key)

    def encoding_for(self, data_key: str, manifest_key: str) -> BlockEncoding:
        """How the segment ``data_key`` belongs to stores its blocks, from its Assigned manifest (remembered when
        this sink opened or resumed it; read otherwise)."""
        encoding = self._encodings.get(data_key)
        if encoding is not None:
            return encoding
        return self._remember_encoding(self._written_manifest(manifest_key))

    def _remember_encoding(self, written: SegmentManifest) -> BlockEncoding:
        encoding = BlockEncoding.of(written, self._keyring())
        self._encodings.remember(written.dataKey, encoding)
        return encoding

    def object_exists(self, key: str) -> bool:
        if key in self._done:
            return True
        if self.store.exists(key):
            self._done.remember(key, True)
            return True
        return False

    def open(self, manifest: SegmentManifest) -> None:
        """Start the segment's multipart upload and record its id in the Assigned manifest, written
        create-only. A replay finds the manifest written first and keeps to its upload; an upload this
        attempt started in vain is aborted at once (never the one holding parts)."""
        key = self.metadata.manifest_key(manifest)
        if self.store.exists(key):
            written = self.metadata.read_manifest(key, manifest.topic)
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        segment = str(mf.manifest_uuid(manifest))
        # No manifest, so no attempt of this segment completed: a data object under its key is what an attempt
        # written whole left before its commit (``_apply_whole``), and parts must not be skipped for it.
        self.store.delete(manifest.dataKey)
        self._done.pop(manifest.dataKey)
        key_id = policy_key_id(manifest)
        if key_id:
            # A fresh data key, recorded (wrapped) in the Assigned manifest before any part is written: the
            # create-only write below makes the first attempt's key the one every replay uses.
            manifest = with_new_data_key(manifest, key_id, self._keyring())
        upload = self.store.start_multipart(manifest.dataKey, object_metadata(manifest.topic, segment))
        recorded = mf.with_driver_property(manifest, mf.PROP_UPLOAD_ID, upload.upload_id)
        written = self.metadata.open_attempt(recorded)
        if mf.driver_property(written, mf.PROP_UPLOAD_ID) != upload.upload_id:
            upload.abort()
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        self._remember_encoding(written)
        self._uploads.remember(manifest.dataKey, upload)

    def _resume(self, written: SegmentManifest) -> MultipartWrite:
        upload_id = mf.driver_property(written, mf.PROP_UPLOAD_ID)
        if not upload_id:
            raise StreamOffloadError(
                f"{written.topic}: segment {mf.manifest_uuid(written)} has no recorded upload id "
                "(written by an older version); run `streamoffload cleanup` and restart"
            )
        upload = self.store.resume_multipart(written.dataKey, upload_id)
        self._remember_encoding(written)
        self._uploads.remember(written.dataKey, upload)
        return upload

    def _keyring(self) -> KeyRing:
        if self.keyring is None:
            self.keyring = KeyRing.from_env()
        return self.keyring

    def upload_for(self, data_key: str, manifest_key: str) -> MultipartWrite:
        upload = self._uploads.get(data_key)
        if upload is not None:
            return upload
        # Another executor opened the segment: its manifest says which upload holds the parts.
        return self._resume(self._written_manifest(manifest_key))

    def _written_manifest(self, manifest_key: str) -> SegmentManifest:
        """The Assigned manifest of an open segment, as the first attempt wrote it."""
        try:
            written = self.store.get(manifest_key)
        except ObjectNotFoundError:
            raise FencedError(
                f"the manifest {manifest_key} of this open segment is gone: a newer writer recovered the topic "
                "and abandoned the segment, so this writer must stop"
            ) from None
        return mf.decode_manifest(written, where=manifest_key)

    def seal(self, action: SealAction, whole_size: int | None = None, begun: float | None = None) -> None:
        """Complete the data object, put the index, check the lease and commit (``whole_size``: the size of the
        data object the sink has just put whole, with its index, at ``begun`` on ``clock``). The commit follows
        the seal's first write within ``COMMIT_WINDOW_MS`` or not at all (``CommitWindowError``)."""
        begun = self.clock() if begun is None else begun
        data_key = action.data_key
        topic, segment = action.topic, action.segment
        expected = action.data_length
        parts = action.part_count
        sealed = mf.decode_manifest(action.manifest)
        level = policy_compression_level(sealed)
        if level is not None:
            # Where each stored block lies: the parts' frame records, joined into the manifest's table.
            frames = self._frame_table(sealed, parts)
            sealed = mf.with_driver_property(sealed, mf.PROP_COMPRESSION, "zstd")
            sealed = mf.with_driver_property(sealed, mf.PROP_FRAMES, encode_table(frames))
        if policy_key_id(sealed):
            # The data key is the Assigned manifest's (the sink's, not the segmenter's): the Offloaded one keeps it.
            key = self.metadata.manifest_key(sealed)
            sealed = copy_encryption(self.metadata.read_manifest(key, sealed.topic), sealed)
            if encryption_key_id(sealed) is None:
                raise StreamOffloadError(f"{topic}: segment {segment} should be encrypted but its manifest has no key")
            expected = stored_length(expected, sealed.blockCount)
        if level is not None:
            expected = stored_size(frames)
        if whole_size is not None:
            pass  # written whole, its size checked before (_apply_whole)
        elif self.object_exists(data_key):
            size = self.store.head(data_key).size
            if size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: data object {data_key} has {size} bytes but the replayed seal "
                    f"expects {expected}; the replay differs from the attempt that completed it"
                )
        else:
            upload = self.upload_for(data_key, self.metadata.manifest_key(sealed))
            written = upload.complete(list(range(1, parts + 1)))
            self._uploads.pop(data_key)
            self._done.remember(data_key, True)
            if written.size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: completed data object {data_key} has {written.size} bytes, "
                    f"expected {expected}"
                )
        crash_point("after-complete")
        if whole_size is None:
            self.store.put(action.index_key, action.index, object_metadata(topic, segment))
        crash_point("after-index")
        # Fencing: a writer whose lease was taken over commits nothing; and the commit itself is
        # create-only in the segment's place in the topic's history, so two writers never both win.
        check_epoch(self.scoped, action.epoch)
        # `cleanup` beside the job deletes what nothing names once it is older than twice this window: a seal's
        # objects are named by its commit in time, or never.
        elapsed = self.clock() - begun
        if elapsed * 1000 > COMMIT_WINDOW_MS:
            raise CommitWindowError(
                f"{topic}: segment {segment}: its commit came {elapsed:.0f} s after its seal's first write, later "
                f"than the {COMMIT_WINDOW_MS / 1000:.0f} s cleanup beside the job allows; not committed, written again"
            )
        self.metadata.commit(sealed)
        if level is not None:
            delete_part_frames(self.store, data_key, parts)  # the manifest holds them now

    def _frame_table(self, sealed: SegmentManifest, parts: int) -> tuple[Frame, ...]:
        """The segment's frame table from its parts' frame records; on a replay after the commit (which deleted
        them), the committed manifest's."""
        topic, segment, data_key = sealed.topic, mf.manifest_uuid(sealed), sealed.dataKey
        frames: list[Frame] = []
        for n in range(1, parts + 1):
            key = keys.part_frames_key(data_key, n)
            try:
                frames.extend(PartFrames.decode(self.store.get(key), where=key).frames)
            except ObjectNotFoundError:
                committed = self._committed_frames(sealed)
                if committed is not None:
                    return committed
                raise StreamOffloadError(
                    f"{topic}: segment {segment}: the frame record {key} of part {n} is missing, so where its "
                    "compressed blocks lie is unknown; the segment is retried"
                ) from None
        if len(frames) != sealed.blockCount:
            raise ReplayMismatchError(
                f"{topic}: segment {segment}: its {parts} parts record {len(frames)} compressed blocks, "
                f"its index {sealed.blockCount}"
            )
        return tuple(frames)

    def _committed_frames(self, sealed: SegmentManifest) -> tuple[Frame, ...] | None:
        key = keys.commit_key(self.scoped.prefix, sealed.topic, sealed.ordinal)
        try:
            committed = mf.decode_manifest(self.store.get(key), where=key)
        except ObjectNotFoundError:
            return None
        if mf.manifest_uuid(committed) != mf.manifest_uuid(sealed):
            return None
        return mf.frame_table(committed)
