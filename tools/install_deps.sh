#!/usr/bin/env bash
# Installs everything samplerd needs on a fresh Debian 12 machine (run as root, or via sudo).
# Idempotent: packages already present are skipped quickly. Nothing is fetched outside Debian's
# apt registry; the Python client is installed from this checkout into .venv.
set -euo pipefail

APT_PACKAGES=(
  # Build: offline Bazel 4.2.3 and a C++17 toolchain.
  bazel-bootstrap g++ pkg-config
  # System libraries wrapped by //third_party.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  libcivetweb-dev
  # Python side: the client's runtime deps, torch (CPU, gloo) for the DDP tests, tooling.
  python3 python3-venv python3-pip python3-grpcio python3-protobuf python3-grpc-tools
  python3-numpy python3-torch python3-matplotlib python3-pytest
  # Operations tests: a real Prometheus server scrapes samplerd (tests/python/test_metrics_prometheus.py).
  prometheus
)

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

# The Python client in a venv that sees Debian's torch/grpc/protobuf (nothing large downloaded).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$ROOT/.venv"
fi
if [[ -f "$ROOT/client/python/pyproject.toml" || -f "$ROOT/client/python/setup.py" ]]; then
  "$ROOT/.venv/bin/python" -m pip install -q --no-build-isolation --no-deps "$ROOT/client/python" \
    || "$ROOT/.venv/bin/python" -m pip install -q "$ROOT/client/python"
fi
echo "install_deps: done"
