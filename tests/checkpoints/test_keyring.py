"""The key file must be its owner's alone, as ssh wants its private keys; a manifest's wrapped data key that is
not one is an error naming the segment."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import (
    PROP_ALGORITHM,
    PROP_KEY_ID,
    PROP_WRAPPED_KEY,
    KeyRing,
    segment_cipher,
    with_new_data_key,
)
from streamoffload.codecs.block_cipher import ALGORITHM, new_data_key
from streamoffload.codecs.errors import FormatError
from streamoffload.errors import ConfigError
from streamoffload.storage import keys

TOPIC = "persistent://public/default/t"

pytestmark = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX's")


def key_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"k1": base64.b64encode(new_data_key()).decode()}))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o777])
def test_a_key_file_others_may_read_or_write_is_refused_naming_it_and_its_mode(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, mode)
    with pytest.raises(ConfigError, match=f"^key file {path}: mode {mode:04o} lets group or others") as err:
        KeyRing.from_file(path)
    assert f"chmod 600 {path}" in str(err.value)
    with pytest.raises(ConfigError, match=f"mode {mode:04o}"):
        KeyRing.from_env({"STREAMOFFLOAD_KEYS_FILE": str(path)})


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_key_file_private_to_its_owner_is_read(tmp_path: Path, mode: int) -> None:
    assert sorted(KeyRing.from_file(key_file(tmp_path, mode)).keys) == ["k1"]


def encrypted_manifest(ring: KeyRing) -> mf.SegmentManifest:
    seg_id = uuid.uuid4()
    opened = mf.new_manifest(
        topic=TOPIC,
        segment_id=seg_id,
        ordinal=0,
        format_version=2,
        start=(1, 0),
        assigned_ms=1,
        data_key=keys.data_key("", TOPIC, seg_id),
        index_key=keys.index_key("", TOPIC, seg_id),
    )
    return with_new_data_key(opened, "k1", ring)


def test_a_wrapped_data_key_that_is_not_one_is_an_error_naming_the_segment() -> None:
    ring = KeyRing({"k1": new_data_key()})
    good = encrypted_manifest(ring)
    assert segment_cipher(good, ring, where=good.dataKey) is not None
    assert mf.driver_property(good, PROP_ALGORITHM) == ALGORITHM and mf.driver_property(good, PROP_KEY_ID) == "k1"
    for text, why in [("not base64!", "is not base64"), ("", "records no encryptionWrappedKey")]:
        bad = mf.with_driver_property(good, PROP_WRAPPED_KEY, text)
        with pytest.raises(FormatError, match=f"^{good.dataKey}: segment {mf.manifest_uuid(good)} .*{why}"):
            segment_cipher(bad, ring, where=good.dataKey)
