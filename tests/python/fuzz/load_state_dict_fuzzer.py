"""Fuzz target (atheris): DistributedWeightedSampler.load_state_dict, the decoder of a trainer's
checkpoint state, against a real samplerd (docs/HARDENING.md).

A checkpoint is read back from disk by a trainer that may be of another version, hand-edited, or
damaged: load_state_dict must accept a state or refuse it with a samplerd error (InvalidArgument,
FailedPrecondition, ...) naming what is wrong, and a refused state leaves the sampler as it was.
Any other exception (TypeError, KeyError, OverflowError, ...) or a changed sampler after a refusal
is a finding.

Each input edits a real state_dict() of rank 0 of a 2-rank job: for each known key (and one
extra), keep it, drop it, or replace it with a value of a fuzzed type (ints of every size, bools,
floats with nan/inf, strings, None, lists, dicts); `unacknowledged` is built the same way.

    .venv/bin/python tests/python/fuzz/load_state_dict_fuzzer.py -max_total_time=60 DIR...
    (tools/fuzz/run.sh load_state_dict does this)

Needs the samplerd binary (SAMPLERD_BIN, default bazel-bin/server/samplerd) and atheris (PyPI,
tools/install_deps.sh). Without atheris, `replay(paths)` runs inputs once each (the corpus test,
tests/python/fuzz/test_load_state_dict_corpus.py).
"""

import ctypes
import math
import os
import pathlib
import signal
import subprocess
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "client" / "python"))

try:  # Only the fuzzing run needs it; the corpus replay does not.
    import atheris
except ImportError:  # pragma: no cover - depends on the machine
    atheris = None

KEYS = ["version", "job", "rank", "world_size", "epoch", "position", "deal", "length",
        "unacknowledged", "extra"]
UNACKED_KEYS = ["epoch", "deal", "indices", "losses", "positions"]


class _Bytes:
    """atheris.FuzzedDataProvider's subset used here, also without atheris (corpus replay)."""

    def __init__(self, data: bytes):
        self._data = data
        self._at = 0

    def byte(self) -> int:
        if self._at >= len(self._data):
            return 0
        b = self._data[self._at]
        self._at += 1
        return b

    def int_bytes(self, n: int, signed: bool) -> int:
        chunk = bytes(self.byte() for _ in range(n))
        return int.from_bytes(chunk, "little", signed=signed)

    def text(self) -> str:
        n = self.byte() % 24
        return bytes(self.byte() for _ in range(n)).decode("utf-8", errors="replace")


def _value(src: _Bytes, depth: int = 0):
    """A value of a fuzzed type."""
    kind = src.byte() % 14
    if kind == 0:
        return src.byte() % 8  # Small ints: the common case, near the valid ones.
    if kind == 1:
        return src.int_bytes(8, signed=True)
    if kind == 2:
        return src.int_bytes(16, signed=False)  # Beyond int64.
    if kind == 3:
        return bool(src.byte() & 1)
    if kind == 4:
        return [0.0, -0.0, 1.5, -1.0, math.nan, math.inf, -math.inf, 1e300][src.byte() % 8]
    if kind == 5:
        return src.text()
    if kind == 6:
        return None
    if kind == 7 and depth < 2:
        return [_value(src, depth + 1) for _ in range(src.byte() % 5)]
    if kind == 8 and depth < 2:
        return {src.text(): _value(src, depth + 1) for _ in range(src.byte() % 4)}
    if kind == 9:
        return float(src.byte())
    if kind == 10:
        return str(src.byte() % 8)  # A number as text.
    if kind == 11:
        return b"\x00\x01"
    if kind == 12 and depth < 2:
        return _unacknowledged(src, depth + 1)
    return -(src.byte() % 8)


def _unacknowledged(src: _Bytes, depth: int):
    out = {}
    for key in UNACKED_KEYS:
        op = src.byte() % 4
        if op == 0:  # A well-formed entry.
            out[key] = (src.byte() % 3) if key in ("epoch", "deal") else \
                [src.byte() % 70 for _ in range(src.byte() % 4)]
        elif op == 1:
            out[key] = _value(src, depth)
        # op 2, 3: left out.
    return out


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Harness:
    """A samplerd process, job 'f' (64 samples, 2 ranks) and rank 0's sampler."""

    def __init__(self):
        import samplerd
        from samplerd.torch import DistributedWeightedSampler
        self._samplerd = samplerd
        self._sampler_type = DistributedWeightedSampler
        binary = os.environ.get("SAMPLERD_BIN", str(ROOT / "bazel-bin" / "server" / "samplerd"))
        # The server goes with the fuzzer: libFuzzer ends the process at a finding without
        # running Python's cleanup (PR_SET_PDEATHSIG: SIGTERM when the parent dies).
        self.proc = subprocess.Popen([binary, "--port=0", "--plaintext", "--log_level=2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline()
        prefix = "samplerd listening on "
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"samplerd did not start ({binary}): {line!r}")
        self.address = line[len(prefix):].strip()
        self.client = samplerd.Client(self.address, timeout=20)
        self.sampler = None
        self.reset()

    def reset(self):
        """A fresh job and sampler: after a state was accepted (it may have ended epochs)."""
        if self.sampler is not None:
            self.sampler.close()
        try:
            self.client.delete_job("f")
        except self._samplerd.errors.NotFound:
            pass
        self.client.create_job("f", num_samples=64, world_size=2, loss="loss")
        self.sampler = self._sampler_type(self.client, "f", rank=0, world_size=2,
                                          report_batch_size=8)
        self.base = self.sampler.state_dict()

    def close(self):
        if self.sampler is not None:
            self.sampler.close()
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def one_input(self, data: bytes):
        src = _Bytes(data)
        state = dict(self.base)
        for key in KEYS:
            op = src.byte() % 4
            if op == 1:
                state.pop(key, None)
            elif op == 2:
                state[key] = _value(src)
            elif op == 3 and key == "unacknowledged":
                state[key] = _unacknowledged(src, 0)
            # op 0 (and 3 for other keys): kept as saved.
        before = self.sampler.state_dict()
        epoch_before = self.sampler.epoch
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # RestartWarning is an accepted outcome.
                self.sampler.load_state_dict(state)
        except self._samplerd.errors.SamplerError:
            after = self.sampler.state_dict()
            if after != before or self.sampler.epoch != epoch_before:
                raise AssertionError(f"a refused state changed the sampler: {before} -> "
                                     f"{after} (state {state!r})") from None
            return
        except Exception as e:  # A finding: the decoder let a non-samplerd error out.
            raise AssertionError(f"load_state_dict({state!r}) raised {type(e).__name__}: "
                                 f"{e}") from e
        self.reset()


def replay(paths):
    """Runs each input file (or each file of a directory) once; raises at the first finding."""
    harness = Harness()
    try:
        runs = 0
        for path in map(pathlib.Path, paths):
            files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
            for f in files:
                harness.one_input(f.read_bytes())
                runs += 1
        return runs
    finally:
        harness.close()


def main():
    if atheris is None:
        sys.exit("atheris is not installed: tools/install_deps.sh installs it")
    # Coverage of the client only (instrumenting torch would take minutes and say nothing).
    with atheris.instrument_imports(include=["samplerd"]):
        import samplerd.torch  # noqa: F401
    harness = Harness()
    atheris.Setup(sys.argv, harness.one_input)
    try:
        atheris.Fuzz()
    finally:
        harness.close()


if __name__ == "__main__":
    main()
