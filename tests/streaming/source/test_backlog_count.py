"""``count_backlog``: the entries after a position up to the broker's latest, exact across ledgers (each ledger's
end found by probing), on pulsar-lite's rollover topic (a ledger of 50,000 entries, then a second one)."""

from __future__ import annotations

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, Probe
from streamoffload.status import latest_positions
from streamoffload.streaming.source.backlog import BacklogCount, count_backlog
from tests.fixtures.broker import ROLLOVER_ENTRIES


def test_the_backlog_is_counted_across_ledgers(pulsar_broker: EmbeddedBroker, rollover_topic: tuple[str, int]) -> None:
    topic, count = rollover_topic
    latest = latest_positions(pulsar_broker.service_url, [topic])[topic]
    assert latest is not None and latest[1] == count - ROLLOVER_ENTRIES - 1  # the second ledger's last entry
    client = rr.RawClient(pulsar_broker.service_url, {})
    probes: list[tuple[int, int]] = []

    def probe(after: tuple[int, int]) -> Probe | None:
        probes.append(after)
        return rr.probe_after_raw(client, topic, after)

    first = probe(BEFORE_EARLIEST)
    assert first is not None and first.position[0] < latest[0]
    size = first.approx_bytes  # every entry: a 16-byte payload and its metadata, whose 'seq' grows to 5 digits
    whole = count_backlog(probe, BEFORE_EARLIEST, latest)
    assert whole is not None and whole.entries == count
    assert count * size <= whole.bytes <= count * (size + 8)  # the probed entries' mean size times the count
    probes.clear()
    middle = (first.position[0], 29_999)
    from_middle = count_backlog(probe, middle, latest)
    assert from_middle is not None and from_middle.entries == count - 30_000
    assert len(probes) < 80  # about 2 log2(50,000) probes for the first ledger's end
    in_latest = count_backlog(probe, (latest[0], latest[1] - 7), latest)
    assert in_latest is not None and in_latest.entries == 7  # within the latest ledger
    assert count_backlog(probe, latest, latest) == BacklogCount(0, 0)
    assert count_backlog(probe, BEFORE_EARLIEST, None) == BacklogCount(0, 0)
    # A broker that answers no probe: unknown, not an empty backlog.
    assert count_backlog(lambda after: None, BEFORE_EARLIEST, latest) is None
