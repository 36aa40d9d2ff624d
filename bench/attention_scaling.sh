#!/usr/bin/env bash
# Forward+backward time and peak memory of each attention op and each whole model against
# sequence length at a fixed token count (docs/benchmarks.md), one process per point.
#   bench/attention_scaling.sh [OUT_DIR] [THREADS]
# Writes OUT_DIR/attention_scaling.jsonl and OUT_DIR/attention_scaling.png.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/figures}
threads=${2:-1}
bin=${ATTENTION_BENCH:-build/bench/attention_bench}
tokens=${TOKENS:-16384}
lengths=${LENGTHS:-"64 128 256 512 1024 2048 4096"}
ops=${OPS:-"softmax linrec lightsans lisa model:sasrec model:linrec model:lightsans model:lisa"}
[ -x "$bin" ] || { echo "missing $bin: build first (cmake --build build)" >&2; exit 1; }
source bench/blas_env.sh
mkdir -p "$out"
jsonl="$out/attention_scaling.jsonl"
: > "$jsonl"
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads=$threads, tokens=$tokens, OpenBLAS ${OPENBLAS_CORETYPE:-auto}" >&2
for L in $lengths; do
  for op in $ops; do
    line=$(OMP_NUM_THREADS=$threads "$bin" --op "$op" --len "$L" --tokens "$tokens" --dim 64 --heads 1 \
             --interests 20 --codebooks 8 --codewords 16 --iters 2)
    echo "$line" | tee -a "$jsonl" >&2
  done
done
python3 bench/plot_attention_scaling.py "$jsonl" "$out/attention_scaling.png"
