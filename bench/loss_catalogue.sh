#!/usr/bin/env bash
# Training step time and peak memory of the three losses against the catalogue size, on
# synthetic data: --loss ce (softmax over every item), --loss sampled (over the target and S
# drawn items, logQ-corrected) and --loss bce (one negative per target), SASRec at d 64, 2
# blocks, max_len 50, batch 128, one rank at one thread (docs/benchmarks.md, "Losses against
# the catalogue size").
#   bench/loss_catalogue.sh [items...]         (default: 10000 100000 1000000)
# SEQREC=path picks the binary, STEPS the timed steps (default 10, after 2 untimed), NEGATIVES
# the sampled softmax's S (default 1000), SAMPLER its --loss_sampler (default uniform), LOSSES
# the losses (default "ce sampled bce").
set -euo pipefail
cd "$(dirname "$0")/.."
items=("$@")
[ ${#items[@]} -gt 0 ] || items=(10000 100000 1000000)
bin=${SEQREC:-build/seqrec}
steps=${STEPS:-10}
negatives=${NEGATIVES:-1000}
sampler=${SAMPLER:-uniform}
[ -x "$bin" ] || { echo "missing $bin: build first (./setup.sh build)" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); binary $bin ($("$bin" --version | head -1))"
echo "== SASRec d 64, 2 blocks, max_len 50, batch 128, 1 thread; $steps timed steps; sampled: S = $negatives, $sampler"
printf '%-9s %-8s %10s %10s\n' items loss s_per_step peak_MiB
for n in "${items[@]}"; do
  rm -rf "$scratch/data"
  "$bin" synth --out "$scratch/data" --users 20000 --items "$n" --events 2000000 --seed 1 --progress=false >/dev/null
  for loss in ${LOSSES:-ce sampled bce}; do
    extra=()
    [ "$loss" = sampled ] && extra=(--loss_negatives "$negatives" --loss_sampler "$sampler")
    run() {  # steps -> wall seconds of the whole command; peak RSS from its [done] line
      rm -rf "$scratch/run"
      local t0 t1
      t0=$(date +%s.%N)
      "$bin" train --data "$scratch/data" --out "$scratch/run" --max_len 50 --hidden 64 --blocks 2 --batch_size 128 \
        --threads 1 --loss "$loss" "${extra[@]}" --max_steps "$1" --epochs 1 --final_test=false \
        --eval_protocol full --full_ranking=false --log_every 1000 > "$scratch/log" 2>&1
      t1=$(date +%s.%N)
      echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}'
    }
    # The difference of two runs is the steps' time alone (set-up, data and checkpoints cancel).
    short=$(run 2)
    long=$(run $((steps + 2)))
    peak=$(sed -n 's/.*peak RSS\/rank=\([0-9]*\) MiB.*/\1/p' "$scratch/log" | tail -1)
    printf '%-9s %-8s %10.3f %10s\n' "$n" "$loss" "$(echo "$short $long $steps" | awk '{print ($2 - $1) / $3}')" "$peak"
  done
done
