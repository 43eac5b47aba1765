"""The checked-in Python stubs match what tools/gen_python_stubs.sh generates from the .proto."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_checked_in_stubs_are_current(tmp_path):
    subprocess.run(["bash", str(ROOT / "tools" / "gen_python_stubs.sh"), str(tmp_path)], check=True)
    for name in ("samplerd_pb2.py", "samplerd_pb2_grpc.py"):
        fresh = (tmp_path / name).read_text()
        checked_in = (ROOT / "client" / "python" / "samplerd" / "_proto" / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run tools/gen_python_stubs.sh"
