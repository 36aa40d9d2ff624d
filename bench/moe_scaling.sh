#!/usr/bin/env bash
# Mixture-of-experts layer tokens/s (forward + backward) at 1, 2 and 3 ranks, experts spread
# over all ranks, one thread per rank (docs/benchmarks.md).
#   [MOE_OUT=docs/figures/moe_scaling.jsonl] bench/moe_scaling.sh [moe_bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${MOE_BENCH:-build/bench/moe_bench}
out=${MOE_OUT:-docs/figures/moe_scaling.jsonl}
[ -x "$bin" ] || { echo "missing $bin: build first (cmake --build build)" >&2; exit 1; }
source bench/blas_env.sh
mkdir -p "$(dirname "$out")"
: > "$out"
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), OpenBLAS ${OPENBLAS_CORETYPE:-auto}" >&2
for np in 1 2 3; do
  OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE -x OMP_WAIT_POLICY=PASSIVE \
    "$bin" "$@" | tee -a "$out"
done
