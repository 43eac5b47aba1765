#!/usr/bin/env bash
# Runs the samplerd DDP demo: a local samplerd plus a 4-rank PyTorch DDP training (gloo, CPU).
# Prints the per-epoch table and writes the plot (default out/demo.png), then the live comparison
# of RHO-LOSS through samplerd with a DistributedSampler (out/demo_rho.png) and the benchmark's
# figures.
#
#   examples/run_demo.sh [SAMPLERD_BINARY] [ddp_demo.py flags, e.g. --plot /tmp/demo.png]
#
# The binary: the first argument, else $SAMPLERD_BIN, else bazel-bin/server/samplerd (built with
# `bazel build //server:samplerd` if missing). Python: $PYTHON, else .venv/bin/python, else
# Debian's /usr/bin/python3 (needs python3-torch, python3-grpcio, python3-protobuf,
# python3-numpy, python3-matplotlib; the client is imported from this checkout). The live
# comparison trains on dataset-fashion-mnist's images, else on python3-sklearn's digits
# (tools/install_deps.sh installs both).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BIN="${SAMPLERD_BIN:-$ROOT/bazel-bin/server/samplerd}"
if [[ $# -gt 0 && "$1" != -* ]]; then
  BIN="$1"
  shift
fi
if [[ ! -x "$BIN" && "$BIN" == "$ROOT/bazel-bin/server/samplerd" ]]; then
  bazel build //server:samplerd 2>&1 | tail -2
fi
if [[ ! -x "$BIN" ]]; then
  echo "run_demo: samplerd binary not found at $BIN" >&2
  exit 1
fi

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  PY=/usr/bin/python3
  [[ -x "$ROOT/.venv/bin/python" ]] && PY="$ROOT/.venv/bin/python"
fi
exec "$PY" "$ROOT/examples/ddp_demo.py" --samplerd="$BIN" "$@"
