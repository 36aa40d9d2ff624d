#!/usr/bin/env bash
# Training time per epoch of several models (and binaries) measured in alternating rounds, so
# that a VM's drift between hours falls on every side alike: how the LinRec / SASRec time ratios
# of docs/benchmarks.md were taken. Each run trains STEPS steps from scratch and reports the
# trainer's extrapolated seconds per epoch and its peak RSS; the summary gives each side's mean
# and each model's ratio to the first model, per binary, and with several binaries each one's
# ratio to the first binary, per model.
#   bench/train_time_rounds.sh [ROUNDS] [STEPS] -- TRAIN FLAGS...
# e.g. (LinRec's paper setting in its released code's scheme, the time bar's own):
#   bench/train_time_rounds.sh 3 80 -- --flagfile configs/ml-1m/linrec.flags --objective last --train_prefixes
# Environment: MODELS (default "sasrec linrec": each a --model after the flags; an entry
# NAME=FLAGFILE runs --flagfile FLAGFILE ahead of the flags instead, so each model can take its own
# config, e.g. MODELS="sasrec=configs/ml-1m/common/sasrec.flags
# linrec=configs/ml-1m/common/linrec.flags" -- --train_windows), BINS (name=path pairs, default
# "build=build/seqrec"; name a second binary to time a change against; BIN_FLAGS_<name> adds
# flags to that entry's runs, so one binary can be timed two ways, e.g. BINS="fp32=build/seqrec
# bf16=build/seqrec" BIN_FLAGS_bf16="--matmul_precision medium"), THREADS (default 1),
# DATA (a prepared ML-1M, default runs/ml-1m-uf, else prepared into BENCH_DIR from
# ../shared/data/ml-1m/sasrec/ml-1m.txt.xz).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-80}
shift $(($# >= 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
models=${MODELS:-sasrec linrec}
bins=${BINS:-build=build/seqrec}
threads=${THREADS:-1}
work=${BENCH_DIR:-/tmp/seqrec-time-rounds}
data=${DATA:-runs/ml-1m-uf}
for m in $models; do
  [[ $m != *=* ]] || [ -f "${m#*=}" ] || { echo "no such flagfile: ${m#*=} (MODELS entry $m)" >&2; exit 1; }
done
mkdir -p "$work"
if [ ! -f "$data/meta.h5" ]; then
  src=${ML1M:-../shared/data/ml-1m/sasrec/ml-1m.txt.xz}
  [ -f "$src" ] || { echo "no prepared data at $data and no $src (see ../shared/data/README.md)" >&2; exit 1; }
  data=$work/ml-1m
  [ -f "$data/meta.h5" ] || "${bins#*=}" prepare --format sasrec --input "$src" --out "$data" --progress=false
fi
for b in $bins; do [ -x "${b#*=}" ] || { echo "not an executable: ${b#*=} (BINS entry $b)" >&2; exit 1; }; done

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $threads thread(s) per run"
echo "== $rounds round(s) of $steps steps; models: $models; binaries: $bins; flags: $*"
for b in $bins; do
  v=BIN_FLAGS_${b%%=*}
  [ -z "${!v:-}" ] || echo "== ${b%%=*} adds: ${!v}"
done
results=$work/results.txt
: > "$results"
for r in $(seq 1 "$rounds"); do
  for entry in $models; do
    m=${entry%%=*}
    if [[ $entry == *=* ]]; then pre=(--flagfile "${entry#*=}") post=(); else pre=() post=(--model "$m"); fi
    for b in $bins; do
      name=${b%%=*} bin=${b#*=} out=$work/run-$m-$name
      extra_var=BIN_FLAGS_$name
      read -r -a extra <<< "${!extra_var:-}"
      rm -rf "$out"
      if ! "$bin" train "${pre[@]}" "$@" "${extra[@]}" "${post[@]}" --data "$data" --out "$out" --threads "$threads" \
          --max_steps "$steps" --final_test=false > "$out.log" 2>&1; then
        echo "round $r $m $name: failed (log: $out.log)" >&2
        tail -3 "$out.log" >&2
        exit 1
      fi
      line=$(grep '^\[done\] steps=' "$out.log")
      sec=$(sed -E 's/.*train time\/epoch=([0-9.]+) s.*/\1/' <<< "$line")
      rss=$(sed -E 's/.*peak RSS\/rank=([0-9]+) MiB.*/\1/' <<< "$line")
      echo "round $r  $m  $name  $sec s/epoch  $rss MiB"
      echo "$m $name $sec $rss $r" >> "$results"
    done
  done
done

echo "== means (s per extrapolated epoch, peak RSS), ratio to the first model under the same binary"
echo "   (then each round's time ratio, lowest to highest: this VM drifts between rounds)"
first=${models%% *}
first=${first%%=*}
first_bin=${bins%% *}
first_bin=${first_bin%%=*}
# With two or more binaries, also each one's time against the first binary's on the same model,
# the figure a change is timed by (per round too: both ran in the same round, minutes apart).
awk -v first="$first" -v fb="$first_bin" -v nbins="$(wc -w <<< "$bins")" '
  { key = $1 " " $2; if (!(key in n)) name[++k] = key; n[key]++; t[key] += $3; if ($4 > m[key]) m[key] = $4
    sec[key, $5] = $3; rounds[$5] = 1 }
  # The lowest and highest of the rounds time ratios of key to base, into lo and hi.
  function round_range(key, base,   r, x) {
    lo = ""; hi = ""
    for (r in rounds)
      if ((key, r) in sec && (base, r) in sec) {
        x = sec[key, r] / sec[base, r]
        if (lo == "" || x < lo) lo = x
        if (hi == "" || x > hi) hi = x
      }
  }
  function mean(key) { return t[key] / n[key] }
  END {
    for (i = 1; i <= k; i++) {
      key = name[i]; split(key, p, " "); base = first " " p[2]
      round_range(key, base)
      printf "%-10s %-8s %9.1f s  %6d MiB  %.3fx time  %.2fx memory  rounds %.3f-%.3fx\n", p[1], p[2], mean(key),
             m[key], mean(key) / mean(base), m[key] / m[base], lo, hi
    }
    if (nbins < 2) exit
    print "== each binary against " fb " on the same model (mean time ratio; each round\047s, lowest to highest)"
    for (i = 1; i <= k; i++) {
      key = name[i]; split(key, p, " "); base = p[1] " " fb
      if (p[2] == fb) continue
      round_range(key, base)
      printf "%-10s %-8s %.3fx time of %s  rounds %.3f-%.3fx\n", p[1], p[2], mean(key) / mean(base), fb, lo, hi
    }
  }' "$results"
