#!/usr/bin/env bash
# seqrec set-up on a fresh Debian 12 machine.
#   ./setup.sh demo   install, build, make a synthetic dataset, train and evaluate on it
#   ./setup.sh test   install, build, run the test suite (what CI runs)
#   ./setup.sh build  install and build only
# Environment: BUILD_DIR (default build), JOBS (default 2), SEQREC_NO_INSTALL=1 skips apt-get,
# CTEST_ARGS (extra ctest arguments, e.g. '-L unit' for one tier; default none: every tier).
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}

packages=(cmake ninja-build g++ ccache libtorch-dev libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libgflags-dev libgoogle-glog-dev libgtest-dev zlib1g-dev liblzma-dev xz-utils
          libopenblas0-pthread)
# The test suite's Slurm end-to-end test starts a one-node cluster of its own.
test_packages=(slurm-wlm munge)

install_packages() {  # [extra packages]
  [ "${SEQREC_NO_INSTALL:-0}" = 1 ] && return 0
  local missing=()
  for p in "${packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[setup] installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" != 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  # ccache's directory outside the clone survives between builds on one machine.
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/seqrec-ccache}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# Faster CPU defaults (machine-facts.md): OpenBLAS is selected through Debian's
# alternatives by installing it; ranks sharing cores should not spin.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

case "$mode" in
  build)
    install_packages; build ;;
  demo)
    install_packages; build
    out=${DEMO_DIR:-runs/demo}
    rm -rf "$out"
    mkdir -p "$out"
    "$BUILD_DIR"/seqrec synth --out "$out/data" --users 2000 --items 400 --events 100000 --seed 1
    "$BUILD_DIR"/seqrec train --data "$out/data" --out "$out/run" --max_len 50 --hidden 32 --epochs 10 \
      --batch_size 128 --log_every 5
    echo "[setup] demo done: metrics in $out/run/metrics.jsonl" ;;
  test)
    install_packages "${test_packages[@]}"; build
    # shellcheck disable=SC2086
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-} ;;
  *)
    echo "usage: $0 demo|test|build" >&2; exit 2 ;;
esac
