"""``checkpoints.pulsar_adopt.parse_internal_info``: the broker's word on which ledgers are offloaded, in both JSON
shapes Pulsar answers ``info-internal`` with, and refusals naming the field. (Adoption itself runs against a real
broker: tests/interop/test_pulsar_offloaded.py.)"""

from __future__ import annotations

import uuid

import pytest

from streamoffload.checkpoints.pulsar_adopt import AdoptError, PulsarLedger, parse_internal_info
from streamoffload.codecs.metadata import uuid_to_msb_lsb

U = uuid.UUID("cea46ec8-2299-4152-90c0-4861dc0eaacb")


def test_pulsar_4_internal_info_in_ledger_order() -> None:
    # As Apache Pulsar 4.0.7 answered GET .../internal-info (its ledger list is not in ledger order).
    doc = {
        "version": 8,
        "ledgers": [
            {"ledgerId": 8, "timestamp": 1796167530785, "isOffloaded": False},
            {
                "ledgerId": 5,
                "entries": 20,
                "size": 1200,
                "timestamp": 17,
                "isOffloaded": True,
                "offloadedContextUuid": str(U),
            },
            {"ledgerId": 7, "entries": 20, "size": 1300, "timestamp": 19, "isOffloaded": False},
        ],
    }
    assert parse_internal_info(doc, "info") == [
        PulsarLedger(5, 20, 1200, U, 17),
        PulsarLedger(7, 20, 1300, None, 19),
        PulsarLedger(8, 0, 0, None, 1796167530785),
    ]


def test_protobuf_json_offload_context() -> None:
    msb, lsb = uuid_to_msb_lsb(U)
    doc = {
        "ledgers": [
            {
                "ledgerId": "3",
                "entries": "4",
                "size": "90",
                "offloadContext": {"uidMsb": msb, "uidLsb": lsb, "complete": True},
            },
            {
                "ledgerId": 4,
                "entries": 2,
                "size": 9,
                "offloadContext": {"uidMsb": msb, "uidLsb": lsb, "complete": False},
            },
        ]
    }
    assert parse_internal_info(doc, "info") == [PulsarLedger(3, 4, 90, U), PulsarLedger(4, 2, 9, None)]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"cursors": {}}, r"info: not a managed ledger's internal info"),
        ({"ledgers": [{"ledgerId": -1}]}, r"info: ledgers\[0\]\.ledgerId: expected an integer in \[0, 2\^63\), got -1"),
        ({"ledgers": [{"ledgerId": 1, "entries": True}]}, r"ledgers\[0\]\.entries: .* got True"),
        ({"ledgers": [{"ledgerId": 1, "offloadedContextUuid": "nope"}]}, r"offloadedContextUuid: 'nope' is not a UUID"),
        ({"ledgers": ["x"]}, r"ledgers\[0\]: expected an object, got str"),
    ],
)
def test_refusals_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(AdoptError, match=message):
        parse_internal_info(doc, "info")
