"""The fuzz bench's short version (``bench/fuzz.py``, issue 52): mutated inputs of each kind, from a fixed seed,
to every reader and to cleanup and verify over a store the project's writers seeded. No input may crash a reader
(an exception other than a one-line ``StreamOffloadError`` naming the object), take more than the allocation
bound, or make cleanup delete what a committed segment names.

200 inputs of each payload kind (milliseconds each) and 60 of each store kind (each is read by six readers over
the whole seeded store, tens of milliseconds of CPU): the suite's share stays under a minute on 2 cores; the
bench itself runs 10,000 per kind (bench/README.md "fuzz")."""

from __future__ import annotations

import pytest

from bench.fuzz import DEFAULT_BOUND, KINDS, PAYLOAD_KINDS, fuzz, summary

SEED = 52
PAYLOAD_COUNT = 200
STORE_COUNT = 60


@pytest.mark.parametrize("kind", KINDS)
def test_no_input_crashes_a_reader_allocates_beyond_the_bound_or_loses_committed_data(
    kind: str, tmp_path: object
) -> None:
    count = PAYLOAD_COUNT if kind in PAYLOAD_KINDS else STORE_COUNT
    tallies, violations = fuzz(SEED, count, (kind,), work_dir=str(tmp_path))
    assert tallies[kind].inputs == count
    assert not violations, summary(tallies, violations, DEFAULT_BOUND)
    assert tallies[kind].max_peak <= DEFAULT_BOUND
