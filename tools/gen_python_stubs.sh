#!/usr/bin/env bash
# Regenerates the checked-in Python stubs of proto/samplerd.proto (Debian's protoc 3.21 and
# grpc_python_plugin 1.51, the versions the tests use). tests/python/test_stubs.py fails when the
# checked-in files differ from what this script writes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/client/python/samplerd/_proto}"
mkdir -p "$OUT"
protoc --proto_path="$ROOT/proto" --python_out="$OUT" --grpc_python_out="$OUT" \
  --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin "$ROOT/proto/samplerd.proto"
# The generated service module imports its messages as a top-level module; make it relative.
sed -i 's/^import samplerd_pb2 as samplerd__pb2$/from . import samplerd_pb2 as samplerd__pb2/' \
  "$OUT/samplerd_pb2_grpc.py"
