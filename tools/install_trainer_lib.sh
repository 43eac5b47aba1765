#!/usr/bin/env bash
# Installs the C++ trainer library for trainers built without Bazel (CMake, Make):
#   PREFIX/lib/libsamplerd_trainer.a             //client/cpp:trainer and //proto, one archive
#   PREFIX/include/samplerd/client/cpp/*.h        the public headers, and the generated
#   PREFIX/include/samplerd/proto/*.pb.h          proto headers they include
#   PREFIX/lib/pkgconfig/samplerd-trainer.pc     Cflags and Libs (Debian's gRPC, Protobuf,
#                                                Abseil; cudart from /usr/local/cuda)
# The tree is built by Bazel (//client/cpp:trainer_install_tree): what bazel-bin already holds
# is reused, nothing is rebuilt that is up to date. The system libraries stay shared (the .pc
# names them), so a consumer needs the same Debian -dev packages (tools/install_deps.sh).
#
#   tools/install_trainer_lib.sh PREFIX
#   cmake -S my_trainer -B build -DCMAKE_PREFIX_PATH=PREFIX   # pkg_check_modules(samplerd-trainer)
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs samplerd-trainer
set -euo pipefail

if [[ $# -ne 1 || -z "$1" || "$1" == -* ]]; then
  echo "usage: $0 PREFIX   (installs lib/, include/samplerd/ and lib/pkgconfig/ under PREFIX)" >&2
  exit 2
fi
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

target=//client/cpp:trainer_install_tree
# Debian's linux-sandbox prints a debug line per action: filtered, as in run_tests.sh.
bazel build "$target" 2>&1 | { grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' || true; } >&2
if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
  echo "install_trainer_lib: bazel build $target failed" >&2
  exit 1
fi
tree="$(bazel info bazel-bin 2>/dev/null)/client/cpp/trainer_install_tree"
[[ -f "$tree/lib/libsamplerd_trainer.a" ]] || {
  echo "install_trainer_lib: $tree/lib/libsamplerd_trainer.a missing after the build" >&2
  exit 1
}

# Headers of an older install that this one no longer has must not linger.
rm -rf "$prefix/include/samplerd"
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
# -L: the headers in the tree are links into Bazel's outputs; install the files.
cp -RL --no-preserve=mode "$tree/include/samplerd" "$prefix/include/"
cp --no-preserve=mode "$tree/lib/libsamplerd_trainer.a" "$prefix/lib/"
cp --no-preserve=mode "$tree/lib/pkgconfig/samplerd-trainer.pc" "$prefix/lib/pkgconfig/"
echo "install_trainer_lib: installed into $prefix" \
  "($(find "$prefix/include/samplerd" -name '*.h' | wc -l) headers;" \
  "pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --libs samplerd-trainer)"
