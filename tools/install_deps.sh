#!/usr/bin/env bash
# Installs everything samplerd needs on a fresh Debian 12 machine (run as root, or via sudo).
# Idempotent: packages already present are skipped quickly. Nothing is fetched outside Debian's
# apt registry and PyPI; the Python client and the test tools are installed into .venv.
#
#   tools/install_deps.sh                everything: build, tests, Python client (CI, developers)
#   tools/install_deps.sh --server-only  only what `bazel build //server:samplerd` needs (the
#                                        container image's build stage: no torch, no .venv)
set -euo pipefail

server_only=0
case "${1:-}" in
  "") ;;
  --server-only) server_only=1 ;;
  *) echo "install_deps: unknown argument '$1' (expected nothing or --server-only)" >&2; exit 2 ;;
esac

# What building the server needs; a library the server links goes here, so that the image's
# build stage (deploy/docker/Dockerfile) gets it.
SERVER_BUILD_PACKAGES=(
  # Build: offline Bazel 4.2.3 and a C++17 toolchain.
  bazel-bootstrap g++ pkg-config
  # System libraries wrapped by //third_party.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgoogle-glog-dev libgflags-dev zlib1g-dev
  # The metrics endpoint (--metrics_port) is served with CivetWeb (//third_party:civetweb).
  libcivetweb-dev
  # TLS: libssl-dev for the server's PEM checks and token digests (//third_party:openssl).
  libssl-dev
)
APT_PACKAGES=(
  "${SERVER_BUILD_PACKAGES[@]}"
  # Test-only C++ libraries wrapped by //third_party.
  libgtest-dev libgmock-dev libbenchmark-dev
  # The out-of-tree CMake trainer built against the installed trainer library
  # (tests/cmake_consumer, tools/install_trainer_lib.sh; pkg-config is in the list above).
  cmake
  # The openssl tool for the certificates the TLS tests make (tests/make_test_certs.sh).
  openssl
  # Python side: the client's runtime deps, torch (CPU, gloo) for the DDP tests, tooling.
  python3 python3-venv python3-pip python3-grpcio python3-protobuf python3-grpc-tools
  python3-numpy python3-torch python3-matplotlib python3-pytest python3-yaml
  # The policy benchmark's real data sets (bench/policy_data.py; no download at run time):
  # scikit-learn's bundled load_digits and load_breast_cancer (the quick version), and
  # Fashion-MNIST (60,000 + 10,000 images in /usr/share/datasets/fashion-mnist, the full one).
  python3-sklearn dataset-fashion-mnist
  # The text-mixture benchmark's domains (bench/text_mixture_data.py; no download at run time):
  # C headers, the Python standard library (python3 above), licence texts and changelogs (every
  # package's /usr/share/doc), manual pages (troff source).
  libc6-dev manpages manpages-dev
  # Deploy checks (tests/python/test_deploy*.py): shellcheck for the scripts, systemd-analyze
  # for the unit, setpriv (util-linux) for the image-start check.
  shellcheck systemd util-linux
  # The metrics test scrapes a real samplerd with Debian's Prometheus server.
  prometheus
  # The network tests (tests/python/test_network_paths.py) put samplerd and the ranks in
  # network namespaces joined by veth links: iproute2's `ip`.
  iproute2
  # Fuzzing (docs/HARDENING.md, tools/fuzz/run.sh): clang 14 with its sanitizer and libFuzzer
  # runtimes (--config=fuzz). The ASan/UBSan/TSan configs use g++'s runtimes (in g++ above).
  clang-14 libclang-rt-14-dev libfuzzer-14-dev
)
((server_only)) && APT_PACKAGES=("${SERVER_BUILD_PACKAGES[@]}")

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all apt packages present"
fi

if ((server_only)); then
  echo "install_deps: done (server build only)"
  exit 0
fi

# The Python client in a venv that sees Debian's torch/grpc/protobuf (nothing large downloaded).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$ROOT/.venv"
fi
# The grpc.health.v1 stubs (samplerctl health) are not in Debian: from PyPI, pinned to Debian's
# grpcio 1.51 and without its dependencies, so that pip does not replace Debian's grpcio/protobuf.
"$ROOT/.venv/bin/python" -m pip install -q --no-deps grpcio-health-checking==1.51.1
# Editable: samplerctl, the demo and any process that imports samplerd (a forkserver child does
# not inherit the parent's sys.path) run the checkout's client, never a copy installed from an
# older tree.
if [[ -f "$ROOT/client/python/pyproject.toml" || -f "$ROOT/client/python/setup.py" ]]; then
  "$ROOT/.venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e "$ROOT/client/python" \
    || "$ROOT/.venv/bin/python" -m pip install -q -e "$ROOT/client/python"
fi
# The Python fuzz target (tests/python/fuzz/load_state_dict_fuzzer.py): atheris, libFuzzer for
# Python (a manylinux wheel; 3.0.0 is the newest with one for Debian 12's Python 3.11).
"$ROOT/.venv/bin/python" -m pip install -q "atheris==3.0.0"
# Deploy checks: kubernetes-validate ships the Kubernetes JSON schemas (validates offline).
"$ROOT/.venv/bin/python" -m pip install -q "kubernetes-validate==1.37.0"

# The framework integrations (Lightning, Accelerate, Transformers, torchdata) are tested on the
# current PyPI stack, in an environment of its own (Debian's torch 1.13 stays in .venv): every
# package pinned in tools/frameworks-requirements.txt, installed without dependency resolution.
# ~4.6 GB and minutes to download (docs/INTEGRATIONS.md), so it is made once per machine and
# pinned list, in $SAMPLERD_CACHE (default ~/.cache/samplerd) under the list's hash, and
# .venv-frameworks links to it: checkouts and CI runs on one machine share it.
FW_REQS="$ROOT/tools/frameworks-requirements.txt"
fw_hash="$(sha256sum "$FW_REQS" | cut -c1-16)"
fw_env="${SAMPLERD_CACHE:-$HOME/.cache/samplerd}/venv-frameworks-$fw_hash"
if [[ ! -f "$fw_env/.complete" ]]; then
  echo "install_deps: installing the PyPI framework stack into $fw_env (minutes)"
  rm -rf "$fw_env"
  mkdir -p "$(dirname "$fw_env")"
  /usr/bin/python3 -m venv "$fw_env"
  "$fw_env/bin/python" -m pip install -q --no-deps -r "$FW_REQS"
  touch "$fw_env/.complete"
fi
[[ -L "$ROOT/.venv-frameworks" || ! -e "$ROOT/.venv-frameworks" ]] || rm -rf "$ROOT/.venv-frameworks"
ln -sfn "$fw_env" "$ROOT/.venv-frameworks"
echo "install_deps: done"
