"""``streamoffload read``: print offloaded entries (or messages) of a topic-partition as JSON lines."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import (
    CommandError,
    add_store_args,
    config_from_args,
    int_arg,
    ledger_id_arg,
    topic_arg,
)
from streamoffload.codecs.compression import MAX_UNCOMPRESSED, max_uncompressed
from streamoffload.codecs.entry import decode_entry, split_messages
from streamoffload.codecs.positions import MAX_ID, Position
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.read.dataset_plan import refuse_corrupt
from streamoffload.read.segment import DEFAULT_CACHE_BYTES, ChunkCache, EntryNotFoundError, OffloadedEntry
from streamoffload.read.topic_reader import TopicReader, parse_position
from streamoffload.storage import keys
from streamoffload.storage.location import ScopedStore

EPILOG = """\
examples:
  streamoffload read --store file:///var/offload persistent://public/default/orders-partition-0
  streamoffload read --conf conf/streamoffload.toml orders-partition-0 --from 12:0 --to 12:99 --messages
  streamoffload read --store s3://bucket/offload --s3-endpoint http://127.0.0.1:9000 orders --limit 10
  streamoffload read --store file:///var/offload --data-key public/default/t/1b4e...-ledger-42 \\
      --index-key public/default/t/1b4e...-ledger-42-index

Each line is one JSON object. Per entry: {"ledger_id", "entry_id", "payload"} where payload is the base64
of the entry bytes (Pulsar's headers-and-payload format). With --messages, per message: {"ledger_id",
"entry_id", "batch_index", "key", "properties", "publish_time", "event_time", "payload"} where payload is
the base64 of the message payload and batch_index is -1 for a non-batched entry. An end-to-end encrypted
entry holds ciphertext, which is not split into messages: --messages prints one line for it,
{"ledger_id", "entry_id", "encrypted": true, "num_messages", "publish_time", "producer_name"}, without
payloads (read it without --messages for its bytes, stored as the producer wrote them).

Segments are found through the offload metadata in the store. Every entry's CRC-32C is checked before it
is printed (in both modes); a mismatch, or a segment manifest that does not decode where the range may
need it, stops the read with an error naming the object (and the byte offset) and exit status 1.
--data-key/--index-key read one segment by its object keys instead (no metadata needed); keys are relative
to the store (and to --conf's prefix)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "read",
        help="print offloaded entries of a topic-partition (or of one segment's objects) as JSON lines",
        description=(
            "Read offloaded entries back from the object store by topic-partition and position range, across "
            "segments, ledgers and object formats (v1 ledger-based and v2 streaming), and print them as JSON lines."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument(
        "topic", metavar="TOPIC", nargs="?", help="topic-partition, e.g. persistent://public/default/t-partition-0"
    )
    parser.add_argument("--from", dest="start", metavar="LEDGER:ENTRY", help="first position to print (inclusive)")
    parser.add_argument("--to", dest="end", metavar="LEDGER:ENTRY", help="last position to print (inclusive)")
    parser.add_argument("--limit", type=int, metavar="N", help="print at most N lines (entries, or messages)")
    parser.add_argument("--messages", action="store_true", help="one line per Pulsar message instead of per entry")
    parser.add_argument("--data-key", metavar="KEY", help="read this data object directly (no metadata needed)")
    parser.add_argument("--index-key", metavar="KEY", help="its index object (default: DATA_KEY-index)")
    parser.add_argument(
        "--ledger-id", type=int, metavar="N", help="ledger id of a v1 data object not named ...-ledger-<N>"
    )
    follow = parser.add_argument_group("following the broker")
    follow.add_argument(
        "--follow",
        action="store_true",
        help="after the store's last entry, go on from the broker at the entry after it and print new entries as "
        "they arrive, until interrupted (or --to, or --limit): the store's history and the broker's present as one "
        "stream, each entry once",
    )
    follow.add_argument(
        "--service-url", metavar="URL", help="the broker for --follow (default: [pulsar] serviceUrl of --conf)"
    )
    follow.add_argument(
        "--poll-seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="with --follow, how often to ask the broker for new entries when there are none (default: %(default)s)",
    )
    parser.add_argument(
        "--no-readahead",
        action="store_true",
        help="never read ahead (default: several GETs in flight from remote stores; local files are read ahead "
        "by the kernel)",
    )
    parser.add_argument(
        "--readahead-bytes", type=int, metavar="N", help="bytes fetched ahead of the reader (default: 4 read buffers)"
    )
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=DEFAULT_CACHE_BYTES,
        metavar="N",
        help="bound of the chunk cache in bytes (default: %(default)s)",
    )
    parser.set_defaults(func=run)


class ReadCommandError(CommandError):
    """Arguments that do not make a read."""


def _refuse_corrupt(reader: TopicReader, topic: TopicName, start: Position | None, end: Position | None) -> None:
    """Refuse a read that a manifest of ``topic`` that does not decode may cover (``CorruptManifestError``); say
    on stderr which foreign manifests (another topic's, or naming objects not its own) the read leaves out."""
    corrupt = reader.metadata.corrupt_manifests(topic)
    for bad in corrupt:
        if bad.foreign:
            print(f"warning: {bad.error}; it is left out of the read (run `streamoffload verify`)", file=sys.stderr)
    if corrupt:
        refuse_corrupt(str(topic), corrupt, reader.metadata.offloaded_segments(topic), start, end)


def _position(text: str | None, flag: str) -> Position | None:
    if text is None:
        return None
    try:
        return parse_position(text)
    except ValueError as err:
        raise ReadCommandError(f"{flag}: {err}") from None


def _b64(data: bytes | memoryview) -> str:
    return base64.b64encode(data).decode("ascii")


def _entry_line(entry: OffloadedEntry) -> dict[str, Any]:
    return {"ledger_id": entry.ledger_id, "entry_id": entry.entry_id, "payload": _b64(entry.payload)}


def _message_lines(entry: OffloadedEntry, max_uncompressed: int) -> Iterator[dict[str, Any]]:
    where = f"entry {entry.ledger_id}:{entry.entry_id}"
    decoded = decode_entry(entry.payload, where=where)  # checks the CRC-32C
    if decoded.encrypted:
        md = decoded.metadata
        yield {
            "ledger_id": entry.ledger_id,
            "entry_id": entry.entry_id,
            "encrypted": True,
            "num_messages": decoded.num_messages,
            "publish_time": md.publish_time,
            "producer_name": md.producer_name,
        }
        return
    for msg in split_messages(decoded, where=where, max_uncompressed=max_uncompressed):
        yield {
            "ledger_id": entry.ledger_id,
            "entry_id": entry.entry_id,
            "batch_index": msg.batch_index,
            "key": msg.key,
            "properties": msg.properties,
            "publish_time": msg.publish_time,
            "event_time": msg.event_time,
            "payload": _b64(msg.payload),
        }


def write_lines(
    entries: Iterator[OffloadedEntry],
    out: TextIO,
    *,
    messages: bool,
    limit: int | None,
    max_uncompressed: int = MAX_UNCOMPRESSED,
) -> int:
    """Print entries (or their messages, each payload inflated to at most ``max_uncompressed`` bytes) as JSON
    lines; returns the number of lines."""
    count = 0
    if limit is not None and limit <= 0:
        return 0
    for entry in entries:
        lines = _message_lines(entry, max_uncompressed) if messages else iter((_entry_line(entry),))
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
            out.write("\n")
            count += 1
            if limit is not None and count >= limit:
                return count
    return count


def run(args: argparse.Namespace) -> int:
    int_arg(args.cache_bytes, "--cache-bytes", 0, MAX_ID, "the cache bound is a byte count")
    int_arg(args.readahead_bytes, "--readahead-bytes", 0, MAX_ID, "the read-ahead is a byte count")
    int_arg(args.limit, "--limit", 0, MAX_ID, "the line limit is a count")
    ledger_id_arg(args.ledger_id, "--ledger-id")
    config, _ = config_from_args(args)
    start = _position(args.start, "--from")
    end = _position(args.end, "--to")
    if start is not None and end is not None and start > end:
        raise ReadCommandError(f"--from {args.start} is after --to {args.end}")
    if args.index_key and not args.data_key:
        raise ReadCommandError("--index-key needs --data-key")
    if not args.topic and not args.data_key:
        raise ReadCommandError("give a TOPIC (or --data-key KEY to read one segment's objects)")
    if args.follow and args.data_key:
        raise ReadCommandError("--follow reads a TOPIC, not one segment's objects (--data-key)")
    if not args.poll_seconds > 0:
        raise ReadCommandError(f"--poll-seconds: expected a number of seconds above 0, got {args.poll_seconds}")
    topic = topic_arg(args.topic, config) if args.topic else None
    location = config.store.location
    prefix = location.prefix
    policy_topic = topic or _topic_of_key(prefix, args.data_key)
    read_buffer = config.policy_for(policy_topic).managedLedgerOffloadReadBufferSizeInBytes
    scoped = location.open(create=False)  # a mistyped path is an error, not a new empty store
    reader = TopicReader(
        scoped,
        read_buffer_size=read_buffer,
        cache=ChunkCache(args.cache_bytes),
        readahead=False if args.no_readahead else None,
        readahead_bytes=args.readahead_bytes,
        keyring=config.encryption.keyring(),  # segments encrypted at rest: [encryption] keysFile, the environment
    )
    try:
        if args.data_key:
            data_key = _under(prefix, args.data_key)
            index_key = _under(prefix, args.index_key) if args.index_key else None
            manifest = stored_manifest(reader.metadata, prefix, data_key, index_key)
            if manifest is not None and args.ledger_id is None:  # its manifest says how it is encrypted, if it is
                entries = reader.open_segment(manifest).read_range(start, end)
            else:
                entries = reader.read_objects(data_key, index_key, start, end, ledger_id=args.ledger_id)
        elif args.follow:
            assert topic is not None
            _refuse_corrupt(reader, topic, start, end)
            service_url = args.service_url or config.pulsar.service_url
            entries = follow_entries(
                reader, scoped, str(topic), service_url, dict(config.pulsar.client), start, end, args
            )
        else:
            assert topic is not None
            _refuse_corrupt(reader, topic, start, end)
            entries = reader.read(topic, start, end)
        if not args.follow:
            entries = _check_start(entries, start, topic, reader)
        try:
            # A reader of our output that goes away (`| head`) is a BrokenPipeError, which streamoffload.cli
            # turns into a quiet exit for every command.
            write_lines(
                entries,
                sys.stdout,
                messages=args.messages,
                limit=args.limit,
                max_uncompressed=max_uncompressed(config.pulsar.max_message_size),
            )
            sys.stdout.flush()
        finally:
            close = getattr(entries, "close", None)
            if close is not None:
                close()
    finally:
        reader.close()
        scoped.store.close()
    return 0


def follow_entries(
    reader: TopicReader,
    scoped: ScopedStore,
    topic: str,
    service_url: str,
    client_options: dict[str, str],
    start: Position | None,
    end: Position | None,
    args: argparse.Namespace,
) -> Iterator[Any]:
    """``--follow``: the topic-partition's entries from ``start`` (or its first) through the store and then the
    broker (``read.through``: the store where it holds the next entry, the broker after),
    asking the broker for its latest position every ``--poll-seconds`` while nothing is new; ends at ``end``."""
    from streamoffload.pulsar import raw_reader as rr
    from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, ReaderSettings
    from streamoffload.read.through import (
        BrokerFront,
        StoredHistory,
        read_through_range,
        stored_entries,
    )

    client = rr.RawClient(service_url, client_options)
    settings = ReaderSettings()
    metadata = MetadataStore(scoped)
    cur: Position = BEFORE_EARLIEST if start is None else (start[0], start[1] - 1)
    try:
        while end is None or cur < end:
            history = StoredHistory.of(metadata.offloaded_segments(topic))
            latest = rr.latest_position_raw(client, topic)
            stored_last = history.last()
            if stored_last is not None and (latest is None or stored_last > latest):
                latest = stored_last
            target = latest if end is None or (latest is not None and latest < end) else end
            if latest is None or target is None or target <= cur:
                time.sleep(args.poll_seconds)
                continue
            for entry in read_through_range(
                topic,
                cur,
                target,
                history=history,
                read_stored=lambda after, last: stored_entries(reader, topic, after, last),
                read_broker=lambda after, last, known: rr.read_range_raw(
                    client, topic, after, last, settings=settings, end_is_known=known
                ),
                broker=BrokerFront(
                    lambda after: rr.probe_after_raw(client, topic, after, settings=settings),
                    lambda: rr.latest_position_raw(client, topic),
                ),
                end_is_known=target == latest,
                store_name=f"the store ({scoped.describe()})",
            ):
                cur = entry.position
                yield entry
    finally:
        client.close()


def stored_manifest(
    metadata: MetadataStore, prefix: str, data_key: str, index_key: str | None = None
) -> SegmentManifest | None:
    """The Offloaded manifest naming the objects ``data_key`` (and ``index_key``, if given), if there is one: an
    encrypted segment's objects are read through it (it holds the wrapped data key), plain ones need none."""
    topic = _topic_of_key(prefix, data_key)
    for manifest in metadata.offloaded_segments(topic):
        if manifest.dataKey == data_key and index_key in (None, manifest.indexKey):
            return manifest
    return None


def _topic_of_key(prefix: str, key: str) -> TopicName:
    """The topic whose directory holds ``key``, for its read-buffer policy; objects outside any topic
    directory get the policy of the default namespace."""
    directory = _under(prefix, key).rpartition("/")[0]
    try:
        return keys.parse_topic_dir(directory, prefix)
    except TopicNameError:
        return TopicName.parse("persistent://public/default/unknown")


def _under(prefix: str, key: str) -> str:
    """A key given on the command line, under the configured prefix unless it already starts with it."""
    key = key.strip("/")
    if not prefix or key.startswith(prefix + "/"):
        return key
    return f"{prefix}/{key}"


def _check_start(
    entries: Iterator[OffloadedEntry], start: Position | None, topic: TopicName | None, reader: TopicReader
) -> Iterator[OffloadedEntry]:
    """Refuse an explicit --from that is not an offloaded position (before printing anything)."""
    iterator = iter(entries)
    first = next(iterator, None)
    if start is not None and (first is None or first.position != start):
        where = f"topic {topic}" if topic is not None else "the segment"
        after = f"; the first offloaded entry after it is {first.ledger_id}:{first.entry_id}" if first else ""
        coverage = f" ({reader.coverage(topic)})" if topic is not None else ""
        raise EntryNotFoundError(f"position {start[0]}:{start[1]} is not offloaded in {where}{after}{coverage}")
    if first is None:
        return
    yield first
    yield from iterator
