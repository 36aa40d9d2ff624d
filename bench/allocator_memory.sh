#!/usr/bin/env bash
# Peak resident memory and training time per epoch against the number of training steps, for
# the ML-1M configs, under one host allocator (docs/benchmarks.md, "Heap allocator"). Memory
# that keeps growing with the step count is heap fragmentation or a leak; a flat column is what
# a long run needs.
#   bench/allocator_memory.sh DATA DATA_WITH_USER_FEATURES [steps...]
# DATA from `seqrec prepare --format sasrec`, DATA_WITH_USER_FEATURES the same with
# --user_features (FLASH4Rec's gate); steps default to 10 40 150. SEQREC=path picks the binary,
# HOST_ALLOCATOR=caching|system the --host_allocator (default caching), CONFIGS the configs
# (default "flash4rec sasrec lisa-base linrec").
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,10p "$0" >&2; exit 2; }
data=$1 data_uf=$2
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(10 40 150)
bin=${SEQREC:-build/seqrec}
host_allocator=${HOST_ALLOCATOR:-caching}
[ -x "$bin" ] || { echo "missing $bin: build first (./setup.sh build)" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); binary $bin"
echo "== --host_allocator=$host_allocator"
printf '%-10s %6s %9s %12s %7s %7s  %s\n' config steps peak_MiB s_per_epoch maps unmaps allocator
for cfg in ${CONFIGS:-flash4rec sasrec lisa-base linrec}; do
  d=$data
  [ "$cfg" = flash4rec ] && d=$data_uf
  for n in "${steps[@]}"; do
    rm -rf "$scratch/run"
    log=$("$bin" train --flagfile "configs/ml-1m/$cfg.flags" --data "$d" --out "$scratch/run" --threads 1 \
          --final_test=false --log_every 100000 --max_steps "$n" --host_allocator "$host_allocator" 2>&1) || { echo "$log" >&2; exit 1; }
    peak=$(sed -n 's/.*peak RSS\/rank=\([0-9]*\) MiB.*/\1/p' <<<"$log")
    per_epoch=$(sed -n 's/.*train time\/epoch=\([0-9.]*\) s.*/\1/p' <<<"$log")
    alloc=$(sed -n 's/^\[setup\] allocator: \(.\{0,40\}\).*/\1/p' <<<"$log")
    maps=$(sed -n 's/.*host allocator: .* \([0-9]*\) maps, \([0-9]*\) unmaps.*/\1/p' <<<"$log")
    unmaps=$(sed -n 's/.*host allocator: .* \([0-9]*\) maps, \([0-9]*\) unmaps.*/\2/p' <<<"$log")
    printf '%-10s %6s %9s %12s %7s %7s  %s\n' "$cfg" "$n" "$peak" "$per_epoch" "${maps:--}" "${unmaps:--}" "${alloc:-?}"
  done
done
