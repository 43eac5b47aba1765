#!/usr/bin/env bash
# The main job: installs what is missing, builds samplerd, starts it locally and runs a small
# 4-rank PyTorch DDP training (gloo, CPU) against it. Prints a per-epoch table (shard sizes,
# overlap between ranks, effective sample size, minority share, loss, balanced accuracy) and
# writes out/demo.png; then trains RHO-LOSS through samplerd against a DistributedSampler live
# (3 paired seeds, out/demo_rho.png) and prints the benchmark's figures (examples/ddp_demo.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/install_deps.sh
bazel build //server:samplerd 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -2
mkdir -p out
exec bash examples/run_demo.sh "$ROOT/bazel-bin/server/samplerd" --plot=out/demo.png "$@"
