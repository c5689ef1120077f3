"""``manifest.policy_field``: the policy a segment was opened under is read from its manifest's driver property,
which a damaged or hostile manifest can hold anything in: one ``FormatError`` naming the manifest's segment."""

from __future__ import annotations

import uuid

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import FormatError

SEGMENT = uuid.UUID("9b55230d-1ff1-5afe-97da-87ba133c7505")
TOPIC = "persistent://public/default/orders-partition-0"
WHERE = f"manifest of segment {SEGMENT} of {TOPIC}"


def opened(policy: str | None) -> mf.SegmentManifest:
    return mf.new_manifest(
        topic=TOPIC,
        segment_id=SEGMENT,
        ordinal=0,
        format_version=2,
        start=(3, 0),
        assigned_ms=1,
        data_key="d",
        index_key="d-index",
        driver_properties={} if policy is None else {mf.PROP_POLICY: policy},
    )


def test_a_recorded_policys_fields_read_as_text_and_absent_ones_as_the_default() -> None:
    manifest = opened('{"managedLedgerOffloadMaxBlockSizeInBytes":4096,"offloadCompression":null}')
    assert mf.policy_field(manifest, "managedLedgerOffloadMaxBlockSizeInBytes") == "4096"
    assert mf.policy_field(manifest, "offloadCompression", "none") == "none"
    assert mf.policy_field(opened(None), "offloadCompression", "none") == "none"
    assert mf.policy_field(opened(""), "offloadCompression", "none") == "none"


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ("{", "driver property 'policy' is not JSON: Expecting property name enclosed in double quotes"),
        ("AAAA", "driver property 'policy' is not JSON: Expecting value"),
        ("9" * 5000, "driver property 'policy' is not JSON: Exceeds the limit"),
        ("[]", "driver property 'policy' is not a JSON object but list"),
        ("null", "driver property 'policy' is not a JSON object but NoneType"),
    ],
)
def test_a_recorded_policy_that_is_not_a_json_object_is_one_error_naming_the_manifest(policy: str, why: str) -> None:
    with pytest.raises(FormatError, match=f"^{WHERE}: {why}") as err:
        mf.policy_field(opened(policy), "managedLedgerOffloadMaxBlockSizeInBytes")
    assert "\n" not in str(err.value)
