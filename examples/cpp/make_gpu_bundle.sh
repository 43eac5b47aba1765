#!/usr/bin/env bash
# Kept for its callers: the GPU machine's bundle is now one for every run (the trainer, samplerd,
# the backend comparison, the GPU tests), made by tools/gpu/make_bundle.sh (read it for what is
# carried and why). Default destination: out/gpu_bundle (and out/gpu_bundle.tgz, which travels).
#
#   examples/cpp/make_gpu_bundle.sh [DEST]
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/gpu/make_bundle.sh" "$@"
