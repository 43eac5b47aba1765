"""The resume rule (samplerd.resume_check) on the test vectors that the C++ client's
resume_check_test runs too (client/testdata/resume_cases.json): the two clients decide every case
alike. Pure logic: no server."""

import json
import pathlib

import pytest

import samplerd
from samplerd import resume_check

CASES = pathlib.Path(__file__).resolve().parents[2] / "client" / "testdata" / "resume_cases.json"
VECTORS = json.loads(CASES.read_text())
CODES = {"INVALID_ARGUMENT": samplerd.InvalidArgument,
         "FAILED_PRECONDITION": samplerd.FailedPrecondition}


def _inputs(case):
    saved = {**VECTORS["saved_default"], **case.get("saved", {})}
    server = {**VECTORS["server_default"], **case.get("server", {})}
    return resume_check.SavedPosition(**saved), resume_check.ServerProgress(**server)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_resume_case(case):
    saved, server = _inputs(case)
    expect = case["expect"]
    if isinstance(expect, str):
        assert resume_check.check_resume(saved, server) == {
            "position": resume_check.POSITION, "next_epoch": resume_check.NEXT_EPOCH}[expect]
        return
    with pytest.raises(CODES[expect["code"]]) as e:
        resume_check.check_resume(saved, server)
    message = str(e.value)
    for part in expect.get("says", []) + expect.get("says_python", []):
        assert part in message, f"{part!r} not in {message!r}"
    for part in expect.get("says_not", []):
        assert part not in message, f"{part!r} in {message!r}"


def test_the_vectors_cover_every_outcome():
    """A file that lost its refusals (or its resumes) would test nothing of them."""
    outcomes = {c["expect"] if isinstance(c["expect"], str) else c["expect"]["code"]
                for c in VECTORS["cases"]}
    assert outcomes == {"position", "next_epoch", "INVALID_ARGUMENT", "FAILED_PRECONDITION"}


SERVED_AGAIN = json.loads((CASES.parent / "served_again_cases.json").read_text())


@pytest.mark.parametrize("case", SERVED_AGAIN["cases"],
                         ids=[c["name"] for c in SERVED_AGAIN["cases"]])
def test_served_again_case(case):
    """The rule of a restart without a state, on the vectors the C++ client's
    resume_check_test runs too (client/testdata/served_again_cases.json)."""
    start = {**SERVED_AGAIN["start_default"], **case.get("start", {})}
    server = resume_check.ServerProgress(**{**SERVED_AGAIN["server_default"],
                                            **case.get("server", {})})
    assert resume_check.served_again(start["epoch"], start["deal"], server) == \
        case["served_again"]


def test_the_served_again_vectors_count_something():
    """A file that lost its counted cases would test only the zeros."""
    assert any(c["served_again"] > 0 for c in SERVED_AGAIN["cases"])
