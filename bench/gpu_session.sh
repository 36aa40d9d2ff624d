#!/usr/bin/env bash
# One GPU session on a machine with a PyTorch wheel (LibTorch 2.x with CUDA) and none of the
# Debian -dev packages, run from the repository root, within one time budget:
#   1. build seqrec against the wheel (../shared/tools/device-prep.sh stages the other
#      dependencies in .device/, which must travel with the tree; CMake also needs LZMA:
#      (cd .device/debs && apt-get download liblzma-dev liblzma5)), and test the CUDA kernels
#      against the CPU's before anything runs on them;
#   2. time training epochs on the GPU, alone on it, with the peak GPU memory: SASRec and LinRec
#      (LinRec's paper setting and the common setting, ML-1M, max_len 200; the paper setting also
#      in the released code's prefix scheme at batch 2048, PREFIX_STEPS steps), LISA-Base,
#      Routing and LightSANs in their configs, each kernel also against its reference (--fused_kernels=false),
#      and FLASH4Rec; the common setting and FLASH4Rec also in the CPU's 8 length slices;
#      time the attention ops forward + backward at L = 200, 1,024, 4,096 (OP_BENCH=0 skips);
#      time SASRec's and LinRec's attention alone at the prefix scheme's batch (PREFIX_SPLIT=0
#      skips); profile 10 steps of SASRec and LinRec in the common setting (PROFILE=0 skips);
#   3. start the training runs listed in GPU_RUNS (one "NAME FLAGS..." per line, # comments;
#      bench/gpu_runs_flash4rec_size.txt is one such list), side by side
#      on the GPU, each cut off at the budget's end (SIGTERM: it checkpoints); a run whose NAME
#      is a directory in RESUME_DIR (default .devruns, carried) continues from it;
#   4. meanwhile build and run the GPU test tier (models and CLI runs against their CPU twins);
#   5. collect every log under $OUT: summary.txt (the lines that matter), build.log, tests.log,
#      runs.tar.gz (each run's train.log, metrics.jsonl, flags.txt); with runs and CARRY=1
#      (the default) the logs go into logs.tar.gz and each run's newest checkpoint and best model
#      into carry-NAME.tgz.NN parts (bench/run_carry.sh: unpack them into .devruns here and
#      carry it to continue the runs next session; a device call brings back 8 files at most).
# Environment: OUT (results folder, required), DATA (a prepared ML-1M dataset with user
# features; default .devdata/ml-1m-uf), BUDGET_S (seconds from the start until the runs are
# stopped and the results written; default 540), GPU_RUNS (files, space-separated; default none), TIMING=0
# skips step 2, PROFILE=0 skips step 2b and PROFILE_SCHEME=prefix profiles the prefix scheme there,
# TESTS=0 skips step 4, GPU_TESTS (a gtest filter for test_cli; default
# '*Cuda*:*Device*'), TIME_ONLY (an extended regex: step 2 times only the names it matches),
# OPS (the attention_bench ops of step 2a, space-separated; default all of them).
set -uo pipefail
: "${OUT:?set OUT to a folder for the results}"
DATA=${DATA:-.devdata/ml-1m-uf}
BUDGET_S=${BUDGET_S:-540}
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
left() { local l=$((BUDGET_S - $(elapsed) - 20)); echo $((l > 10 ? l : 10)); }  # seconds a step may take
summary=$OUT/summary.txt
say() { echo "[$(elapsed)s] $*" | tee -a "$summary"; }

source .device/env.sh
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
say "cores: $(nproc)"
for f in ${GPU_RUNS:-}; do [ -f "$f" ] || { say "GPU_RUNS: no such file: $f"; exit 1; }; done

# 1. Build the executable first; the tests build while the runs train.
# The device's copy of the tree has no .git: SEQREC_REVISION (say, from `git describe --always
# --dirty --abbrev=12` here, put on the device command line) names the build instead of "unknown".
if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH" \
     -DSEQREC_REVISION="${SEQREC_REVISION:-}" > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
grep "seqrec: MPI=" "$OUT/build.log" | tee -a "$summary"
if ! ninja -C build-gpu seqrec test_gated_attention test_interest_attention test_linear_attention test_lisa_attention \
     test_kernels_switch \
     test_routing_attention \
     attention_bench \
     >> "$OUT/build.log" 2>&1; then
  grep -B3 -A12 -m5 "error" "$OUT/build.log" | head -120; exit 1
fi
say "built $(build-gpu/seqrec --version | head -1)"
B=build-gpu/seqrec
# The CUDA kernels against the CPU's before anything is timed or trained with them.
# A kernel that fails its test trains nothing: the listed runs then take the ATen references
# (--fused_kernels=false; slower, correct), and the summary says so.
: > "$OUT/ops-tests.log"
run_kernels=""
for t in test_gated_attention test_interest_attention test_linear_attention test_lisa_attention test_routing_attention \
  test_kernels_switch; do
  timeout "$(left)" build-gpu/tests/ops/$t > /tmp/$t.log 2>&1
  rc=$?
  say "$t (CUDA kernel included): rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$t.log | tr '\n' ' ')"
  [ $rc = 0 ] || run_kernels="--fused_kernels=false"
  cat /tmp/$t.log >> "$OUT/ops-tests.log"
done
[ -z "$run_kernels" ] || say "a CUDA kernel failed its test: the listed runs use the ATen references ($run_kernels)"

# 2. Epoch times, alone on the GPU (validation excluded from the per-epoch figure): SASRec and
# LinRec in LinRec's paper setting and in the common one, LISA-Base and Routing in their own.
# NAME-ref is NAME through the ATen references (--fused_kernels=false), as before the kernels.
time_epochs() {  # name, flags...
  local name=$1; shift
  [[ "$name" =~ ${TIME_ONLY:-.} ]] || return 0
  local run=/tmp/time-$name
  rm -rf $run
  $B train "$@" --data "$DATA" --out $run --epochs 3 --eval_every 3 --final_test=false --device cuda \
    --threads 4 --eval_batch 256 --log_every 1000 > $run.log 2>&1 || { tail -20 $run.log; }
  say "time $name: $(grep -h '^\[done\] steps' $run/train.log 2>/dev/null || tail -3 $run.log)"
}
if [ "${TIMING:-1}" != 0 ]; then
  for m in sasrec linrec; do time_epochs "paper-$m" --flagfile configs/ml-1m/linrec.flags --model $m; done
  time_epochs paper-linrec-ref --flagfile configs/ml-1m/linrec.flags --fused_kernels=false
  for m in sasrec linrec; do time_epochs "common-$m" --flagfile configs/ml-1m/common/$m.flags; done
  time_epochs common-linrec-ref --flagfile configs/ml-1m/common/linrec.flags --fused_kernels=false
  # The batch in 8 length slices (the CPU's default) rather than whole (the device's): on the CPU
  # slicing saves padding work, on a host-bound GPU step it multiplies the launches.
  for m in sasrec linrec; do time_epochs "common-$m-sliced" --flagfile configs/ml-1m/common/$m.flags --length_groups 8; done
  time_epochs flash4rec --flagfile configs/ml-1m/flash4rec.flags
  time_epochs flash4rec-ref --flagfile configs/ml-1m/flash4rec.flags --fused_kernels=false
  time_epochs flash4rec-sliced --flagfile configs/ml-1m/flash4rec.flags --length_groups 8
  # LinRec's paper setting as its released code trains it, the time bar's own scheme: every
  # prefix an example scored at its last slot, batch 2048 (a compute-bound GPU step, unlike the
  # batches of 128 above); PREFIX_STEPS steps each, twice, alternating.
  for i in 1 2; do
    for m in sasrec linrec; do
      time_epochs "prefix-$m-$i" --flagfile configs/ml-1m/linrec.flags --model $m --objective last --train_prefixes \
        --batch_size 2048 --max_steps "${PREFIX_STEPS:-120}"
    done
  done
  # The same with TensorFloat-32 products (--matmul_precision high): the GEMMs both models share
  # (projections, feed-forward, the loss) were most of the step at float32.
  for m in sasrec linrec; do
    time_epochs "prefix-$m-tf32" --flagfile configs/ml-1m/linrec.flags --model $m --objective last --train_prefixes \
      --batch_size 2048 --max_steps "${PREFIX_STEPS:-120}" --matmul_precision high
  done
  # And with the layers', attention's and loss's products on bfloat16 operands (medium).
  for m in sasrec linrec; do
    time_epochs "prefix-$m-bf16" --flagfile configs/ml-1m/linrec.flags --model $m --objective last --train_prefixes \
      --batch_size 2048 --max_steps "${PREFIX_STEPS:-120}" --matmul_precision medium
  done
  # The same in 8 length slices: at batch 2048 a slice is still large, and slicing cuts the
  # padded work of ML-1M's prefixes to 0.65x (linear in L) and 0.55x (SASRec's L^2 maps).
  for m in sasrec linrec; do
    time_epochs "prefix-$m-sliced" --flagfile configs/ml-1m/linrec.flags --model $m --objective last --train_prefixes \
      --batch_size 2048 --max_steps "${PREFIX_STEPS:-120}" --length_groups 8
  done
  # LISA-Base's, Routing's and LightSANs' kernels against their references, in each model's own
  # config (LightSANs': its paper setting).
  for m in lisa-base routing lightsans; do
    time_epochs "$m" --flagfile configs/ml-1m/$m.flags
    time_epochs "$m-ref" --flagfile configs/ml-1m/$m.flags --fused_kernels=false
  done
fi

# 2a. The causal product (CUDA kernel, ATen reference), LinRec's and FLASH4Rec's attention (the
# cosine form's linear path; the softmax form and Top-K dropout through the CUDA kernel and the
# ATen reference; past L = 1,536 in float the kernel's scratch does not fit and both run the reference),
# LISA's histogram attention (CUDA kernel, ATen reference), routing attention, LightSANs' interest
# attention (CUDA kernel, ATen reference), softmax attention and five whole models, forward + backward, alone on the GPU.
ALL_OPS="softmax linear linear:reference linrec gated:cosine gated:softmax gated:softmax:reference gated:softmax:topk
         gated:softmax:topk:reference lisa lisa:reference routing routing:reference lightsans lightsans:reference model:sasrec model:linrec model:lisa model:routing model:lightsans"
[ "${OP_BENCH:-1}" = 0 ] || for L in 200 1024 4096; do
  for op in ${OPS:-$ALL_OPS}; do
    say "op $(timeout 60 build-gpu/bench/attention_bench --device cuda --op $op --len $L --tokens 25600 --dim 50 --iters 5 2>&1 | tail -1)"
  done
done

# 2a'. How much of a prefix-scheme step (batch 2048 of L 200, d 128 in 8 heads) is attention:
# SASRec's and LinRec's attention ops alone at that token count, forward and backward
# (PREFIX_SPLIT=0 skips). The rest of the two steps (112 and 73 ms on an H100) is what they share.
[ "${PREFIX_SPLIT:-1}" = 0 ] || for op in softmax linrec:global; do
  say "prefix-scheme attention $op: $(timeout "$(left)" build-gpu/bench/attention_bench --op $op --len 200 \
    --tokens 409600 --dim 128 --heads 8 --iters 10 --device cuda 2>&1 | tail -1)"
done

# 2b. Where a GPU step goes: 10 profiled steps of each model (host-side op times: launches,
# synchronisations and host work), kept as profile-<model>.txt. PROFILE_SCHEME=common (the default)
# profiles the common setting; PROFILE_SCHEME=prefix the time bar's scheme (LinRec's paper setting,
# every prefix scored at its last slot, batch 2048), where about 40 ms of a 47 ms LinRec step on an
# H200 is what the two models share.
if [ "${PROFILE_SCHEME:-common}" = prefix ]; then
  profile_flags() { echo "--flagfile configs/ml-1m/linrec.flags --model $1 --objective last --train_prefixes --batch_size 2048"; }
else
  profile_flags() { echo "--flagfile configs/ml-1m/common/$1.flags"; }
fi
[ "${PROFILE:-1}" = 0 ] || for m in sasrec linrec; do
  run=/tmp/profile-$m
  rm -rf $run
  # shellcheck disable=SC2046
  $B train $(profile_flags $m) --data "$DATA" --out $run --epochs 1 --eval_every 1 --max_steps 20 \
    --final_test=false --device cuda --threads 4 --profile_steps 10 --profile_after 5 --log_every 1000 \
    > $run.log 2>&1 || tail -20 $run.log
  cp $run/profile-rank0.txt "$OUT/profile-$m.txt" 2>/dev/null
  say "profile $m: $(head -3 $run/profile-rank0.txt 2>/dev/null | tr '\n' ' ')"
done

# 3. The training runs, side by side.
pids=()
if [ -n "${GPU_RUNS:-}" ]; then
  while read -r name flags; do
    case "$name" in ''|'#'*) continue ;; esac
    mkdir -p /tmp/runs
    resume=""
    if [ -d "${RESUME_DIR:-.devruns}/$name" ]; then
      rm -rf "/tmp/runs/$name"
      cp -a "${RESUME_DIR:-.devruns}/$name" /tmp/runs/
      resume="--resume auto"
    fi
    # shellcheck disable=SC2086
    $B train $flags $run_kernels $resume --data "$DATA" --out /tmp/runs/$name --device cuda --threads "${RUN_THREADS:-2}" --eval_batch 256 --log_every 60 \
      > /tmp/runs/$name.log 2>&1 &
    pids+=($!)
    say "started run $name${resume:+ (continuing its carried run directory)}"
  done < <(cat ${GPU_RUNS})
fi

# 4. The GPU test tier (TESTS=0 skips it).
if [ "${TESTS:-1}" = 0 ]; then
  say "the GPU test tier skipped (TESTS=0)"
elif ninja -C build-gpu test_models test_cli test_cli_mpi test_io_input >> "$OUT/build.log" 2>&1; then
  say "built the tests"
  say "$(readelf -d build-gpu/seqrec | grep NEEDED | head -4 | tr -s ' ' | tr '\n' ' ')"
  build-gpu/tests/io/test_io_input --gtest_filter='Toolchain*:RemoveTree*' > "$OUT/tests.log" 2>&1
  say "test_io_input Toolchain/RemoveTree: rc=$? $(grep -E 'binds to|^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tr '\n' ' ')"
  export SEQREC_BIN=$PWD/build-gpu/seqrec
  if [ "${MODEL_TESTS:-1}" = 1 ]; then
    timeout "$(left)" build-gpu/tests/models/test_models --gtest_filter='*Cuda*' >> "$OUT/tests.log" 2>&1
    say "test_models (GPU tier): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -1 | tr '\n' ' ')"
  fi
  timeout "$(left)" build-gpu/tests/e2e/test_cli --gtest_filter="${GPU_TESTS:-*Cuda*:*Device*}" >> "$OUT/tests.log" 2>&1
  say "test_cli (GPU tier): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -2 | tr '\n' ' ')"
  # Data parallel on CUDA devices over MPI (two ranks sharing the one GPU).
  timeout "$(left)" build-gpu/tests/e2e/test_cli_mpi --gtest_filter='*Cuda*' >> "$OUT/tests.log" 2>&1
  say "test_cli_mpi (GPU tier): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -2 | tr '\n' ' ')"
else
  grep -B3 -A12 -m5 "error" "$OUT/build.log" | head -60
  say "the tests did not build"
fi

# 5. Wait for the runs until the budget's end, then stop them (SIGTERM: they checkpoint).
while [ ${#pids[@]} -gt 0 ] && [ "$(elapsed)" -lt "$BUDGET_S" ]; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 5
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
sleep 3
if [ -d /tmp/runs ]; then
  for r in /tmp/runs/*/; do
    n=$(basename "$r")
    say "run $n: $(grep -h -E '^\[(select|stop|done)\]' "$r/train.log" | tail -3 | tr '\n' ' ')"
    grep -h "split=test" "$r/train.log" | sed "s/^/[test $n] /" >> "$summary"
  done
  tar -czf "$OUT/runs.tar.gz" -C /tmp/runs --exclude='checkpoints' --exclude='best' --exclude='*.lock' . 2>/dev/null
  if [ "${CARRY:-1}" != 0 ]; then
    (cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls build.log ops-tests.log tests.log profile-*.txt 2>/dev/null))
    for r in /tmp/runs/*/; do
      say "$(bench/run_carry.sh pack "$r" "$OUT" 2>&1 | tail -1)"
    done
  fi
fi
say "done"
