"""Fixtures: a real samplerd binary on a free port (no fakes)."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Test the working tree's client, not an installed copy.
sys.path.insert(0, str(ROOT / "client" / "python"))


def samplerd_binary() -> str:
    path = os.environ.get("SAMPLERD_BIN", str(ROOT / "bazel-bin" / "server" / "samplerd"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"samplerd binary not found at {path}: run `bazel build //server:samplerd` "
                    "or set SAMPLERD_BIN")
    return path


class SamplerdProcess:
    """samplerd started with --port=0; `address` is read from its startup line."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([samplerd_binary(), "--port=0", "--log_level=1", *args],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        prefix = "samplerd listening on "
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"unexpected samplerd output: {line!r}")
        self.address = line[len(prefix):].strip()

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def server():
    process = SamplerdProcess()
    yield process
    assert process.stop() == 0, "samplerd did not exit 0 on SIGTERM"


@pytest.fixture
def client(server):
    import samplerd
    with samplerd.Client(server.address, timeout=20) as c:
        yield c
