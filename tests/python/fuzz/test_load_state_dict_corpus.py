"""The load_state_dict fuzz target's corpus (seeds and every input it crashed on), replayed once
each against a real samplerd: the regression tests of its findings (docs/HARDENING.md)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import load_state_dict_fuzzer  # noqa: E402

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus" / "load_state_dict_fuzzer"


def test_every_corpus_input_is_accepted_or_refused_cleanly():
    from conftest import samplerd_binary  # Fails with the fix when the binary is missing.
    import os
    os.environ.setdefault("SAMPLERD_BIN", samplerd_binary())
    assert load_state_dict_fuzzer.replay([CORPUS]) == len(list(CORPUS.iterdir()))
