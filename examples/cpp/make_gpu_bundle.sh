#!/usr/bin/env bash
# Builds the C++ DDP trainer and samplerd with Bazel (on a build machine) and puts them, with the
# shared libraries they need, into a folder to carry to the GPU machine (which has no Bazel and
# no gRPC/Abseil/protobuf packages): bin/ddp_trainer, bin/samplerd, lib/*.so*, MANIFEST.txt.
# run_on_gpu.sh runs them there.
#
#   examples/cpp/make_gpu_bundle.sh [DEST]      # default out/gpu_trainer (ignored by git)
#
# What is carried (ldd of both binaries): Debian 12's gRPC, protobuf, Abseil, OpenSSL, c-ares,
# re2, zlib, glog/gflags, CivetWeb. Not carried:
#   * glibc (libc, libm, libdl, libpthread, librt, ld-linux) and libstdc++/libgcc_s: the GPU
#     machine's are newer (glibc 2.39, g++ 13) and backward compatible with Debian 12's;
#   * the CUDA runtime: linked statically into both binaries (//third_party:cudart_static), so
#     only the driver's libcuda is needed there;
#   * libnccl.so.2: 218 MB here, beyond what a run can carry (64 MiB); the GPU machine has NCCL
#     2.28 (the version of /usr/local/cuda/include/nccl.h here), found by run_on_gpu.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DEST="${1:-$ROOT/out/gpu_trainer}"
LIMIT_MIB=56  # Leaves room under the device tool's 64 MiB for the working tree.

bazel build //examples/cpp:ddp_trainer //server:samplerd 2>&1 | tail -1
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
for bin in examples/cpp/ddp_trainer server/samplerd; do
  install -m 0755 "bazel-bin/$bin" "$DEST/bin/"
  strip --strip-debug "$DEST/bin/$(basename "$bin")"
done

{
  echo "# Built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD) on $(. /etc/os-release; echo "$PRETTY_NAME")"
  for bin in "$DEST"/bin/*; do
    echo "## ldd $(basename "$bin")"
    ldd "$bin"
  done
} >"$DEST/MANIFEST.txt"

ldd "$DEST"/bin/* | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libstdc++.so.*|\
    libgcc_s.so.*|libnccl.so.*|libcuda.so.*) ;;
    *) cp -L "$lib" "$DEST/lib/" ;;
  esac
done
strip --strip-unneeded "$DEST"/lib/*.so* 2>/dev/null || true

size_kib=$(du -sk "$DEST" | cut -f1)
echo "bundle: $DEST ($((size_kib / 1024)) MiB, $(ls "$DEST/lib" | wc -l) libraries)"
if (( size_kib > LIMIT_MIB * 1024 )); then
  echo "make_gpu_bundle: $DEST is $((size_kib / 1024)) MiB, more than $LIMIT_MIB MiB" >&2
  exit 1
fi
