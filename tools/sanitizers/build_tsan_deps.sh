#!/usr/bin/env bash
# Builds Abseil, protobuf and gRPC with ThreadSanitizer, from Debian 12's own source packages (the
# versions installed, Debian's patches applied), as shared libraries with Debian's sonames, into
# PREFIX. Bazel's --config=tsan_deps (.bazelrc) compiles against PREFIX's headers and links and
# loads PREFIX's libraries, so that TSan sees every memory access and lock of the gRPC stack (as
# gRPC's own TSan CI builds it). docs/HARDENING.md ("TSan with instrumented Abseil, protobuf and
# gRPC") says why and how long it takes.
#
#   tools/sanitizers/build_tsan_deps.sh [PREFIX]     # default /root/.cache/samplerd/tsan-deps
#
# Runs as root on a fresh Debian 12: installs what it builds with (apt), adds a deb-src entry for
# bookworm main (a file of its own) if the system has none, downloads the three source packages
# into PREFIX/src with `apt-get source` (a .dsc already there is reused, not downloaded again).
# Idempotent: one stamp file per package (PREFIX/stamps); a rerun skips the packages done, and
# resumes an interrupted one where its build stopped (ninja, in PREFIX/build).
# Only the libraries samplerd links are built (third_party/BUILD): all of Abseil's (gRPC's
# find_package(absl) needs the complete installed CMake package), libprotobuf(-lite), and gRPC's
# grpc++_reflection grpc++ grpc gpr upb address_sorting; no tests, examples or codegen plugins
# (the system protoc and grpc_cpp_plugin, same versions, generate gRPC's reflection stubs).
# c-ares, re2, OpenSSL and zlib stay Debian's (not instrumented: tools/sanitizers/tsan_suppressions.txt).
# Compiler: the system gcc 12, whose libtsan the Bazel build links. Parallelism: JOBS (default 2),
# niced (the build takes hours on 2 cores: see docs/HARDENING.md).
set -euo pipefail

PREFIX="${1:-/root/.cache/samplerd/tsan-deps}"
JOBS="${JOBS:-2}"
SRC="$PREFIX/src"
STAMPS="$PREFIX/stamps"
BUILD="$PREFIX/build"
TIMES="$PREFIX/build-times.txt"

ABSEIL_VERSION=20220623.1-1+deb12u2
PROTOBUF_VERSION=3.21.12-3+deb12u1
GRPC_VERSION=1.51.1-3

mkdir -p "$SRC" "$STAMPS" "$BUILD"

# ---- What the build needs ----------------------------------------------------------------------
if [[ ! -e "$STAMPS/apt" ]]; then
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ &&
     ! grep -qs '^deb-src .*bookworm ' /etc/apt/sources.list; then
    cat >/etc/apt/sources.list.d/samplerd-tsan-deps-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    dpkg-dev cmake ninja-build g++ pkg-config \
    libc-ares-dev libre2-dev libssl-dev zlib1g-dev \
    protobuf-compiler protobuf-compiler-grpc
  touch "$STAMPS/apt"
fi

# Downloads (unless its .dsc is in $SRC) and unpacks, Debian's patches applied, one source package.
# Prints the source directory.
unpack() {
  local pkg="$1" version="$2" upstream="${2%-*}"
  upstream="${upstream#*:}"
  (
    cd "$SRC"
    if [[ ! -e "${pkg}_${version}.dsc" ]]; then
      apt-get source -q --download-only "$pkg=$version" >&2
    fi
    if [[ ! -d "$pkg-$upstream" ]]; then
      dpkg-source -x "${pkg}_${version}.dsc" "$pkg-$upstream" >&2
    fi
  )
  echo "$SRC/$pkg-$upstream"
}

# The flags every package is compiled and linked with.
TSAN_FLAGS="-fsanitize=thread -O1 -g -fno-omit-frame-pointer"
CMAKE_COMMON=(
  -G Ninja
  -DCMAKE_C_COMPILER=gcc
  -DCMAKE_CXX_COMPILER=g++
  -DCMAKE_BUILD_TYPE=None
  "-DCMAKE_C_FLAGS=$TSAN_FLAGS"
  "-DCMAKE_CXX_FLAGS=$TSAN_FLAGS"
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
  -DCMAKE_CXX_STANDARD=17
  -DBUILD_SHARED_LIBS=ON
  -DBUILD_TESTING=OFF
  "-DCMAKE_INSTALL_PREFIX=$PREFIX"
  -DCMAKE_INSTALL_LIBDIR=lib
  "-DCMAKE_PREFIX_PATH=$PREFIX"
  "-DCMAKE_INSTALL_RPATH=$PREFIX/lib"
)

# Runs "$@" (one package's build), then records its wall time and writes its stamp.
timed() {
  local pkg="$1"
  shift
  if [[ -e "$STAMPS/$pkg" ]]; then
    echo "== $pkg: done already ($STAMPS/$pkg)"
    return
  fi
  echo "== $pkg: building (jobs=$JOBS) $(date -u +%FT%TZ)"
  local start=$SECONDS
  "$@"
  local took=$((SECONDS - start))
  printf '%s %dm%02ds jobs=%s %s\n' "$pkg" $((took / 60)) $((took % 60)) "$JOBS" \
    "$(date -u +%FT%TZ)" >>"$TIMES"
  touch "$STAMPS/$pkg"
  echo "== $pkg: done in $((took / 60))m$((took % 60))s"
}

build_abseil() {
  local src
  src="$(unpack abseil "$ABSEIL_VERSION")"
  cmake -S "$src" -B "$BUILD/abseil" "${CMAKE_COMMON[@]}" -DABSL_PROPAGATE_CXX_STD=ON
  nice -n 5 ninja -C "$BUILD/abseil" -j "$JOBS"
  cmake --install "$BUILD/abseil"
}

build_protobuf() {
  local src
  src="$(unpack protobuf "$PROTOBUF_VERSION")"
  # protobuf 3.21's CMake project is in cmake/; its libprotobuf has Debian's soname (SOVERSION 32).
  cmake -S "$src/cmake" -B "$BUILD/protobuf" "${CMAKE_COMMON[@]}" \
    -Dprotobuf_BUILD_SHARED_LIBS=ON -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_EXAMPLES=OFF \
    -Dprotobuf_BUILD_PROTOC_BINARIES=OFF -Dprotobuf_BUILD_LIBPROTOC=OFF -Dprotobuf_WITH_ZLIB=ON
  nice -n 5 ninja -C "$BUILD/protobuf" -j "$JOBS"
  cmake --install "$BUILD/protobuf"
}

build_grpc() {
  local src
  src="$(unpack grpc "$GRPC_VERSION")"
  # The reflection stubs are generated with the system grpc_cpp_plugin (same version) instead of
  # one built here (which would need libprotoc).
  sed -i 's|set(_gRPC_CPP_PLUGIN \$<TARGET_FILE:grpc_cpp_plugin>)|find_program(_gRPC_CPP_PLUGIN grpc_cpp_plugin)|' \
    "$src/CMakeLists.txt"
  # As debian/rules configures it (system packages for everything), minus plugins and tests.
  # protobuf through CMake's FindProtobuf: PREFIX's library and headers, the system's protoc.
  # libprotoc (not built here) is named only for the configure step: gRPC's grpc_plugin_support
  # library links it, and is not built (only the libraries below are).
  cmake -S "$src" -B "$BUILD/grpc" "${CMAKE_COMMON[@]}" \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
    -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
    -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -DgRPC_BUILD_TESTS=OFF -DgRPC_BUILD_CODEGEN=ON \
    -DgRPC_BUILD_GRPC_CPP_PLUGIN=OFF -DgRPC_BUILD_GRPC_CSHARP_PLUGIN=OFF \
    -DgRPC_BUILD_GRPC_NODE_PLUGIN=OFF -DgRPC_BUILD_GRPC_OBJECTIVE_C_PLUGIN=OFF \
    -DgRPC_BUILD_GRPC_PHP_PLUGIN=OFF -DgRPC_BUILD_GRPC_PYTHON_PLUGIN=OFF \
    -DgRPC_BUILD_GRPC_RUBY_PLUGIN=OFF -DgRPC_INSTALL=OFF \
    -DProtobuf_PROTOC_LIBRARY=/usr/lib/x86_64-linux-gnu/libprotoc.so.32
  # Only the libraries samplerd links (not the _unsecure, alts, channelz variants).
  local libs=(grpc++_reflection grpc++ grpc gpr upb address_sorting)
  nice -n 5 ninja -C "$BUILD/grpc" -j "$JOBS" "${libs[@]}"
  # Installed by hand (gRPC's install rules want every library built): the headers (the same
  # as the system's, so that PREFIX/include is complete) and the libraries with their links.
  mkdir -p "$PREFIX/include" "$PREFIX/lib"
  cp -r "$src/include/grpc" "$src/include/grpc++" "$src/include/grpcpp" "$PREFIX/include/"
  local lib
  for lib in "${libs[@]}"; do
    cp -a "$BUILD/grpc/lib$lib.so"* "$PREFIX/lib/"
  done
}

timed abseil build_abseil
timed protobuf build_protobuf
timed grpc build_grpc

echo "== TSan Abseil, protobuf and gRPC in $PREFIX/lib; build times in $TIMES:"
cat "$TIMES"
