#!/usr/bin/env bash
# Builds, with Bazel on a build machine, every binary a GPU-machine run needs and puts them, with
# the shared libraries they need, into ONE folder, and that folder into one archive to carry there
# (the GPU machine has no Bazel and no gRPC/Abseil/protobuf packages, and compiles nothing).
# tools/gpu/check.sh runs them there (tools/gpu/README.md gives the device-tool call).
#
#   tools/gpu/make_bundle.sh [DEST]      # default out/gpu_bundle (ignored by git)
#
# Makes DEST/ (for a rehearsal here: check.sh --rehearse) and DEST.tgz (what travels: check.sh
# unpacks it when DEST/ is not there).
# What goes in (the lists of targets are the arrays below, in one place):
#   bin/        BINS: samplerd, ddp_trainer, compare_backends, loss_reporter_bench (its device_cost
#               line is ReportFromDevice's host cost), gpu_benchmark, mixture_window_benchmark
#               (a mixture job's window through the CUDA backend, its CPU anchor beside it)
#   runfiles/   KERNEL_TESTS and TRAINER_TESTS as standalone binaries, at their package paths, so
#               that a test run from runfiles/ finds its data as under `bazel test`
#               (tests/loss_reporter_test starts tests/loss_reporter_rank, a TEST_DATA target):
#               kernels/cuda:{identity,cuda_backend,mixture_window}_test (check.sh stages 1-3,
#               7 and 8, by path);
#               the trainer library's device tests (their device cases skip without a GPU, so a
#               skip there is a failure), listed in TESTS.txt for check.sh stage 6
#   lib/        every shared library those need (ldd), Bazel's own (_solib) included
#   TESTS.txt   TRAINER_TESTS, one per line (runfiles-relative); MANIFEST.txt (commit, ldd)
# Not carried:
#   * glibc (libc, libm, libdl, libpthread, librt, ld-linux) and libstdc++/libgcc_s: the GPU
#     machine's are newer (glibc 2.39, g++ 13) and backward compatible with Debian 12's;
#   * libcuda (the driver's); the CUDA runtime is linked statically into samplerd, ddp_trainer and
#     the kernels (//third_party:cudart_static); the client library's tests link libcudart.so.13,
#     which is carried (0.7 MB);
#   * libnccl.so.2: 218 MB here, beyond what a run can carry (64 MiB); the GPU machine has NCCL
#     2.28 (the version of /usr/local/cuda/include/nccl.h here), found by examples/cpp/run_on_gpu.sh.
# Everything is stripped; the archive must stay under LIMIT_MIB (it was 51 MiB unpacked, 18 MiB
# packed, on 2026-11-26), leaving the device tool's 64 MiB room for the working tree (~3 MiB).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DEST="${1:-$ROOT/out/gpu_bundle}"
ARCHIVE="$DEST.tgz"
LIMIT_MIB=48

BINS=(//server:samplerd //examples/cpp:ddp_trainer //tools/gpu:compare_backends
      //bench:loss_reporter_bench //bench:gpu_benchmark //bench:mixture_window_benchmark)
KERNEL_TESTS=(//kernels/cuda:identity_test //kernels/cuda:cuda_backend_test
              //kernels/cuda:mixture_window_test)
TRAINER_TESTS=(//client/cpp:cuda_support_test //client/cpp:device_uploader_test
               //tests:shard_reader_test //tests:loss_reporter_test //tests:epoch_loop_test)
TEST_DATA=(//tests:loss_reporter_rank)
TESTS=("${KERNEL_TESTS[@]}" "${TRAINER_TESTS[@]}")

rm -f "$ARCHIVE"  # A failed run leaves none behind (a stale archive must never travel).

quiet() { grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/|^INFO: From |^(Loading|Analyzing):' || true; }

# One build: a target that does not build fails the bundle (a stale binary must never be carried).
if ! bazel build "${BINS[@]}" "${TESTS[@]}" "${TEST_DATA[@]}" 2>&1 | quiet | tail -3; then
  echo "make_bundle: bazel build failed" >&2
  exit 1
fi

path_of() {  # //pkg:name -> pkg/name
  local t="${1#//}"
  echo "${t%%:*}/${t#*:}"
}

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/runfiles"
built=()  # The binaries in bazel-bin, where their rpaths ($ORIGIN/../_solib_k8) resolve.
for target in "${BINS[@]}"; do
  built+=("bazel-bin/$(path_of "$target")")
  install -m 0755 "${built[-1]}" "$DEST/bin/"
done
: >"$DEST/TESTS.txt"
for target in "${TESTS[@]}" "${TEST_DATA[@]}"; do
  rel="$(path_of "$target")"
  built+=("bazel-bin/$rel")
  mkdir -p "$DEST/runfiles/$(dirname "$rel")"
  install -m 0755 "bazel-bin/$rel" "$DEST/runfiles/$rel"
done
for target in "${TRAINER_TESTS[@]}"; do path_of "$target" >>"$DEST/TESTS.txt"; done
mapfile -t binaries < <(find "$DEST/bin" "$DEST/runfiles" -type f | sort)
strip --strip-unneeded "${binaries[@]}"

{
  commit="$(git rev-parse --short HEAD 2>/dev/null || echo 'a tree outside git')"
  git diff --quiet HEAD 2>/dev/null || commit+=" + local changes"
  echo "# Built $(date -u +%FT%TZ) from $commit on $(sed -n 's/^PRETTY_NAME="\(.*\)"$/\1/p' /etc/os-release)"
  for bin in "${binaries[@]}"; do
    echo "## ldd ${bin#"$DEST"/}"
    ldd "$bin"
  done
} >"$DEST/MANIFEST.txt"

# Resolved with bazel-bin's own rpaths (the tests' _solib libraries).
ldd "${built[@]}" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libstdc++.so.*|\
    libgcc_s.so.*|libnccl.so.*|libcuda.so.*) ;;
    *) cp -L "$lib" "$DEST/lib/" ;;
  esac
done
chmod u+w "$DEST"/lib/*
strip --strip-unneeded "$DEST"/lib/*.so* 2>/dev/null || true

# Everything must resolve from lib/ alone (what check.sh sets), except NCCL and the driver.
missing="$(LD_LIBRARY_PATH="$DEST/lib" ldd "${binaries[@]}" | grep 'not found' \
  | grep -v -e libnccl -e libcuda.so | sort -u || true)"
if [[ -n "$missing" ]]; then
  echo "make_bundle: not resolved from $DEST/lib: $missing" >&2
  exit 1
fi

tar -czf "$ARCHIVE" -C "$(dirname "$DEST")" "$(basename "$DEST")"
size_kib=$(du -sk "$DEST" | cut -f1)
archive_kib=$(($(stat -c %s "$ARCHIVE") / 1024))
echo "bundle: $DEST ($((size_kib / 1024)) MiB: ${#BINS[@]} programs, ${#TESTS[@]} tests, $(find "$DEST/lib" -mindepth 1 -maxdepth 1 | wc -l) libraries); $ARCHIVE ($((archive_kib / 1024)) MiB) travels"
if (( archive_kib > LIMIT_MIB * 1024 )); then
  echo "make_bundle: $ARCHIVE is $((archive_kib / 1024)) MiB, more than $LIMIT_MIB MiB" >&2
  rm -f "$ARCHIVE"
  exit 1
fi
