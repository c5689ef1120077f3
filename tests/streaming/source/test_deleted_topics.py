"""Topics deleted while the source runs (issue 24): the planner lets go of a topic the broker says no longer
exists, keeps its position, reports nothing lost and lists the topics again; a topic created again under the
name is read after that position. pulsar-lite can neither delete a topic nor refuse to create one, so the
broker here is the scripted one of ``test_raw_reader`` (SUBSCRIBE refused with TopicNotFound, as Pulsar answers
a subscription that does not ask to create the topic); every latest position it gives is 7:3."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions
from tests.pulsar.test_raw_reader import ScriptedBroker

A = "persistent://public/default/kept"
B = "persistent://public/default/deleted"


class ListingPlanner(SourcePlanner):
    """The real planner; only the expansion of a configured topic (the broker's partition metadata, which the
    scripted broker does not answer) is a plain list, and counted."""

    expansions = 0

    def _expand(self, topic: str) -> list[str]:
        self.expansions += 1
        return [topic]


@pytest.fixture
def broker() -> Iterator[ScriptedBroker]:
    scripted = ScriptedBroker(missing=set())
    yield scripted
    scripted.close()


@pytest.mark.parametrize("watched", ["30", "0"], ids=["held-consumers", "no-held-consumers"])
def test_a_deleted_topic_is_let_go_at_its_position_and_read_after_it_when_created_again(
    broker: ScriptedBroker, watched: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = SourceOptions.parse(
        {
            "serviceUrl": broker.url,
            "topics": f"{A},{B}",
            "watchedPollSeconds": watched,
            "discoveryIntervalSeconds": "600",
        }
    )
    planner = ListingPlanner(options)
    try:
        end = planner.latest_offset({A: [7, 1], B: [7, 1]}, None, None)
        assert end == {A: [7, 3], B: [7, 3]}
        listed = planner.expansions

        broker.missing.add(B)  # deleted on the broker (with --force: our consumers are closed too)
        with caplog.at_level(logging.WARNING, logger="streamoffload"):
            end = planner.latest_offset({A: [7, 3], B: [7, 3]}, None, None)
            again = planner.latest_offset(end, None, None)
        assert end == again == {A: [7, 3], B: [7, 3]}, "kept at its position: nothing reported lost, nothing skipped"
        warnings = [r.getMessage() for r in caplog.records if B in r.getMessage()]
        assert len(warnings) == 1 and "does not exist on the broker any more" in warnings[0], warnings
        assert "let go after 7:3" in warnings[0]
        assert planner.expansions > listed, "the topics are listed again at once, not after the discovery interval"

        # Never read, and not there: nothing to read, no error either.
        fresh = planner.latest_offset({A: [7, 3]}, None, None)
        assert fresh[B] == [-1, -1]
        broker.missing.add(A)  # none of them there (a job started before its topics were created): no error
        assert planner.latest_offset({}, None, None) == {A: [-1, -1], B: [-1, -1]}
        broker.missing.discard(A)

        broker.missing.discard(B)  # created again under the same name: read after the kept position
        end = planner.latest_offset({A: [7, 3], B: [7, 1]}, None, None)
        assert end[B] == [7, 3]
        broker.missing.add(B)  # and deleted again: said again
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="streamoffload"):
            planner.latest_offset({A: [7, 3], B: [7, 3]}, None, None)
        assert [r for r in caplog.records if B in r.getMessage()]
    finally:
        planner.close()


class NamespacePlanner(SourcePlanner):
    """The real planner over a namespace whose listing (``GetTopicsOfNamespace``, which pulsar-lite does not
    answer) is a plain list the test edits."""

    listing: list[str]

    def _list_namespace(self, namespace: str) -> list[str]:
        return list(self.listing)


def test_a_topic_no_longer_listed_is_forgotten_but_keeps_its_position(broker: ScriptedBroker) -> None:
    options = SourceOptions.parse(
        {"serviceUrl": broker.url, "topicsPattern": "public/default/.*", "discoveryIntervalSeconds": "0"}
    )
    planner = NamespacePlanner(options)
    planner.listing = [A, B]
    try:
        end = planner.latest_offset({A: [7, 1], B: [7, 1]}, None, None)
        planner.commit(end)
        assert set(planner.backlog()) == {A, B} and set(planner.latest_offset_report() or {}) == {A, B}
        planner.listing = [A]  # B deleted: the listing no longer has it
        end = planner.latest_offset(end, None, None)
        planner.commit(end)
        assert end[B] == [7, 3], "its position stays in the offset"
        assert set(planner.backlog()) == {A}, "not reported any more"
        assert set(planner.latest_offset_report() or {}) == {A}
        planner.listing = [A, B]  # listed again: read on from its position
        assert planner.latest_offset(end, None, None)[B] == [7, 3]
        assert set(planner.backlog()) == {A, B}
    finally:
        planner.close()
