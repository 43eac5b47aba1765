#!/usr/bin/env bash
# Installs the C++ trainer library for trainers built without Bazel (CMake, Make):
#   PREFIX/lib/libsamplerd_trainer.a             //client/cpp:trainer_cpu and //proto, one
#                                                archive: the CPU-only library (no CUDA needed)
#   PREFIX/include/samplerd/client/cpp/*.h        the public headers, and the generated
#   PREFIX/include/samplerd/proto/*.pb.h          proto headers they include
#   PREFIX/lib/pkgconfig/samplerd-trainer.pc     Cflags and Libs (Debian's gRPC, Protobuf,
#                                                Abseil)
# With --cuda, also the library with the CUDA device paths (NextToDevice, ReportFromDevice):
#   PREFIX/lib/libsamplerd_trainer_cuda.a        //client/cpp:trainer and //proto
#   PREFIX/include/samplerd/...                  its device headers (client/cpp/cuda_support.h...)
#   PREFIX/lib/pkgconfig/samplerd-trainer-cuda.pc  the same, plus cudart from /usr/local/cuda
# A trainer links one of the two libraries, never both.
# The trees are built by Bazel (//client/cpp:trainer_install_tree, trainer_cuda_install_tree):
# what bazel-bin already holds is reused, nothing is rebuilt that is up to date. The system
# libraries stay shared (the .pc names them), so a consumer needs the same Debian -dev packages
# (tools/install_deps.sh).
#
#   tools/install_trainer_lib.sh [--cuda] PREFIX
#   cmake -S my_trainer -B build -DCMAKE_PREFIX_PATH=PREFIX   # pkg_check_modules(samplerd-trainer)
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs samplerd-trainer
set -euo pipefail

usage() {
  echo "usage: $0 [--cuda] PREFIX   (installs lib/, include/samplerd/ and lib/pkgconfig/ under" \
    "PREFIX; --cuda: also the library with the CUDA device paths)" >&2
  exit 2
}
cuda=0
if [[ $# -ge 1 && "$1" == --cuda ]]; then
  cuda=1
  shift
fi
if [[ $# -ne 1 || -z "$1" || "$1" == -* ]]; then usage; fi
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# name of the tree, library and pkg-config file, per library installed.
trees=("trainer_install_tree samplerd_trainer samplerd-trainer")
if [[ $cuda -eq 1 ]]; then
  trees+=("trainer_cuda_install_tree samplerd_trainer_cuda samplerd-trainer-cuda")
fi
targets=()
for t in "${trees[@]}"; do targets+=("//client/cpp:${t%% *}"); done
# Debian's linux-sandbox prints a debug line per action: filtered, as in run_tests.sh.
bazel build "${targets[@]}" 2>&1 | { grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' || true; } >&2
if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
  echo "install_trainer_lib: bazel build ${targets[*]} failed" >&2
  exit 1
fi
bin="$(bazel info bazel-bin 2>/dev/null)"

# Headers of an older install that this one no longer has must not linger (nor its CUDA library,
# whose headers go with them).
rm -rf "$prefix/include/samplerd"
if [[ $cuda -eq 0 ]]; then
  rm -f "$prefix/lib/libsamplerd_trainer_cuda.a" "$prefix/lib/pkgconfig/samplerd-trainer-cuda.pc"
fi
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
for t in "${trees[@]}"; do
  read -r tree library pc <<<"$t"
  dir="$bin/client/cpp/$tree"
  [[ -f "$dir/lib/lib$library.a" ]] || {
    echo "install_trainer_lib: $dir/lib/lib$library.a missing after the build" >&2
    exit 1
  }
  # The headers this build declares (HEADERS.txt), not whatever the tree's folder holds: Bazel
  # leaves the headers of earlier builds there. -L: they are links into Bazel's outputs.
  while IFS= read -r header; do
    mkdir -p "$prefix/include/$(dirname "$header")"
    cp -L --no-preserve=mode "$dir/include/$header" "$prefix/include/$header"
  done <"$dir/HEADERS.txt"
  cp --no-preserve=mode "$dir/lib/lib$library.a" "$prefix/lib/"
  cp --no-preserve=mode "$dir/lib/pkgconfig/$pc.pc" "$prefix/lib/pkgconfig/"
  echo "install_trainer_lib: installed lib$library.a into $prefix" \
    "(pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --libs $pc)"
done
echo "install_trainer_lib: $(find "$prefix/include/samplerd" -name '*.h' | wc -l) headers" \
  "under $prefix/include/samplerd"
