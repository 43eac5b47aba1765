"""The checked-in Python stubs match what tools/gen_python_stubs.sh generates from the .proto.

Generated with Debian's protoc 3.21 and grpc_python_plugin 1.51 (packages protobuf-compiler,
protobuf-compiler-grpc). Debian's grpc_tools.protoc bundles an older protoc that rejects the
proto3 `optional` field of the .proto, hence checked-in stubs rather than a build hook.
"""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_checked_in_stubs_are_current(tmp_path):
    for tool in ("protoc", "grpc_python_plugin"):
        if shutil.which(tool) is None and not pathlib.Path(f"/usr/bin/{tool}").exists():
            pytest.fail(f"{tool} not found: install protobuf-compiler protobuf-compiler-grpc")
    subprocess.run(["bash", str(ROOT / "tools" / "gen_python_stubs.sh"), str(tmp_path)], check=True)
    for name in ("samplerd_pb2.py", "samplerd_pb2_grpc.py"):
        fresh = (tmp_path / name).read_text()
        checked_in = (ROOT / "client" / "python" / "samplerd" / "_proto" / name).read_text()
        assert fresh == checked_in, f"{name} is stale: run tools/gen_python_stubs.sh"


def test_service_module_imports_its_messages_relatively():
    text = (ROOT / "client" / "python" / "samplerd" / "_proto" / "samplerd_pb2_grpc.py").read_text()
    assert "from . import samplerd_pb2 as samplerd__pb2" in text
    assert "\nimport samplerd_pb2" not in text
