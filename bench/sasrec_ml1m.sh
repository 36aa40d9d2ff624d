#!/usr/bin/env bash
# Re-runs seqrec's side of the SASRec ML-1M speed comparison (docs/benchmarks.md):
# seconds per training epoch in the published setting (configs/ml-1m/sasrec.flags) and the
# time of one full evaluation pass over all 6,040 users (valid and test, sampled-100 and
# full ranking).
#   bench/sasrec_ml1m.sh [THREADS] [EPOCHS]
# Needs ../shared/data/ml-1m/sasrec/ml-1m.txt.xz and build/seqrec.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1}
epochs=${2:-3}
bin=${SEQREC_BIN:-build/seqrec}
src=${ML1M:-../shared/data/ml-1m/sasrec/ml-1m.txt.xz}
work=${BENCH_DIR:-/tmp/seqrec-bench}
[ -f "$src" ] || { echo "missing $src (see ../shared/data/README.md)" >&2; exit 1; }
mkdir -p "$work"
[ -f "$work/ml-1m/meta.h5" ] || "$bin" prepare --format sasrec --input "$src" --out "$work/ml-1m" --progress=false

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
echo "== training: $epochs epochs, $threads thread(s), no evaluation"
rm -rf "$work/run"
start=$(date +%s.%N)
"$bin" train --flagfile configs/ml-1m/sasrec.flags --data "$work/ml-1m" --out "$work/run" --threads "$threads" \
  --epochs "$epochs" --eval_every 1000000 --final_test=false --log_every 30 | grep -E "^\[(done|setup)\]"
echo "   wall incl. start-up: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}') s"
# The final checkpoint holds the trained model; time evaluation passes over all users.
for split in valid test; do
  for proto in sampled full; do
    /usr/bin/time -f "   eval $split $proto: %e s wall, %M KB peak RSS" \
      "$bin" eval --checkpoint "$work/run/checkpoints" --data "$work/ml-1m" --split $split \
      --eval_protocol $proto --threads "$threads" | sed 's/^/   /'
  done
done
