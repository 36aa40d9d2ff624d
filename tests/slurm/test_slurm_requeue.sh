#!/usr/bin/env bash
# Slurm end to end, on a real one-node cluster that this test starts (slurm/local_cluster.sh) and
# stops: slurm/train.sbatch runs seqrec train at 2 ranks under srun (and under mpirun), Slurm's end-of-time warning
# (USR1 to the batch shell, as --signal=B:USR1@N sends it) makes every rank checkpoint and stop,
# the job requeues itself and its second start resumes; its metrics (every validation and the final
# test, to the 6 digits metrics.jsonl keeps) must equal those of a job of the same flags that was
# never stopped. A third job, signalled with SEQREC_MAX_REQUEUES=0, must end with its checkpoint
# and exit status 3 instead of requeueing; a fourth, cancelled by scancel, must checkpoint and not
# requeue; and the script's own errors must name the problem.
#
#   test_slurm_requeue.sh SEQREC_BIN SOURCE_DIR WORK_DIR
# Exit 77 (skipped): not root, or slurm-wlm / munge not installed.
set -uo pipefail

bin=$1
src=$2
work=$3
sbatch_script="$src/slurm/train.sbatch"

fails=0
check() {  # check DESCRIPTION COMMAND...: a failed check is reported and counted, the test goes on
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
die() { echo "FAILED: $*"; exit 1; }

# The script's errors, outside any cluster.
rm -rf "$work"
mkdir -p "$work"
out=$(env -u SLURM_JOB_ID bash "$sbatch_script" --data x --out y 2>&1); rc=$?
check "outside a job: exit 2, named" test "$rc" = 2 -a -n "$(grep 'not inside a Slurm job' <<< "$out")"
out=$(SLURM_JOB_ID=1 SEQREC_BIN="$bin" bash "$sbatch_script" --data x 2>&1); rc=$?
check "without --out: exit 2, named" test "$rc" = 2 -a -n "$(grep -- '--out RUN is required' <<< "$out")"
out=$(SLURM_JOB_ID=1 SEQREC_BIN="$bin" bash "$sbatch_script" --data x --out y --resume auto 2>&1); rc=$?
check "with --resume: exit 2, named" test "$rc" = 2 -a -n "$(grep -- "--resume is this script's" <<< "$out")"
out=$(SLURM_JOB_ID=1 SEQREC_BIN="$work/nothing" bash "$sbatch_script" --data x --out y 2>&1); rc=$?
check "a missing executable: exit 2, named" test "$rc" = 2 -a -n "$(grep "nothing' not found" <<< "$out")"
out=$(SLURM_JOB_ID=1 SEQREC_BIN="$bin" SEQREC_LAUNCHER=ssh bash "$sbatch_script" --data x --out y 2>&1); rc=$?
check "an unknown launcher: exit 2, named" test "$rc" = 2 -a -n "$(grep "SEQREC_LAUNCHER must be" <<< "$out")"

# Slurm's step sockets live in the spool folder, and a socket's path must stay under 108 bytes:
# the cluster's folder is a short one in /tmp, whatever the build folder's depth.# gpu.sbatch only sets the allocation: run as Slurm runs it (a copy in a spool folder), it reaches
# train.sbatch through the submit directory.
cp "$src/slurm/gpu.sbatch" "$work/spool-copy.sbatch"
out=$(cd / && SLURM_JOB_ID=1 SLURM_SUBMIT_DIR="$src" SEQREC_BIN="$bin" bash "$work/spool-copy.sbatch" --data x 2>&1); rc=$?
check "gpu.sbatch runs train.sbatch from the submit directory" \
  test "$rc" = 2 -a -n "$(grep -- '--out RUN is required' <<< "$out")"

cluster=$(mktemp -d /tmp/seqrec-slurm.XXXXXX)
SLURM_LOCAL_PORT=${SLURM_LOCAL_PORT:-$((17000 + RANDOM % 2000 * 2))} "$src/slurm/local_cluster.sh" start "$cluster"
rc=$?
[ "$rc" = 77 ] && { echo "SKIPPED: no local Slurm cluster can run here (above)"; exit 77; }
[ "$rc" = 0 ] || die "the local cluster did not start: $(tail -n 5 "$cluster"/log/*.log 2> /dev/null)"
trap '"$src/slurm/local_cluster.sh" stop "$cluster"; rm -rf "$cluster"' EXIT
export SLURM_CONF="$cluster/slurm.conf"

cd "$work" || exit 1
"$bin" synth --out data --users 400 --items 300 --events 20000 --seed 1 > synth.log 2>&1 || die "synth: $(tail -n 3 synth.log)"
flags=(--data data --max_len 20 --hidden 64 --epochs 30 --batch_size 32 --threads 1 --checkpoint_every 5 --log_every 1)
submit() {  # submit NAME [env assignments]: the job id
  local name=$1; shift
  sbatch --parsable -O --ntasks-per-node=2 --job-name="$name" --chdir="$work" --output="$work/$name.out" \
    --export="ALL,SEQREC_BIN=$bin${1:+,$1}" "$sbatch_script" "${flags[@]}" --out "$work/$name"
}
field() { scontrol show job "$1" 2> /dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
wait_end() {  # wait_end JOB SECONDS: the final state, or TIMEOUT
  local s
  for ((i = 0; i < $2; ++i)); do
    s=$(field "$1" JobState)
    case "$s" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$s"; return ;; esac
    sleep 1
  done
  echo TIMEOUT
}
signal_after_checkpoint() {  # JOB RUN [scancel options]: once RUN has a checkpoint, signal JOB
  local job=$1 name=$2; shift 2
  has_checkpoint() { ls "$work/$name/checkpoints" 2> /dev/null | grep -q step-; }
  for ((i = 0; i < 600; ++i)); do has_checkpoint && break; sleep 0.1; done
  has_checkpoint || { echo "no checkpoint in $name after 60 s"; return 1; }
  scancel "$@" "$job"
}

ref=$(submit reference) || die "sbatch refused the reference job"
run=$(submit requeued) || die "sbatch refused the job to requeue"
run_mpi=$(submit requeued-mpirun SEQREC_LAUNCHER=mpirun) || die "sbatch refused the mpirun job to requeue"
capped=$(submit capped SEQREC_MAX_REQUEUES=0) || die "sbatch refused the capped job"
cancelled=$(submit cancelled) || die "sbatch refused the job to cancel"
echo "jobs: reference $ref, requeued $run (srun) and $run_mpi (mpirun), capped $capped, cancelled $cancelled"
# The warning Slurm sends --signal=B:USR1@N ahead of the time limit: to the batch shell only.
signal_after_checkpoint "$run" requeued --batch --signal=USR1 || fails=$((fails + 1))
signal_after_checkpoint "$run_mpi" requeued-mpirun --batch --signal=USR1 || fails=$((fails + 1))
signal_after_checkpoint "$capped" capped --batch --signal=USR1 || fails=$((fails + 1))
# A plain scancel: TERM to the batch shell and the ranks, SIGKILL KillWait (30 s) later.
signal_after_checkpoint "$cancelled" cancelled || fails=$((fails + 1))

s_run=$(wait_end "$run" 240)
s_mpi=$(wait_end "$run_mpi" 120)
s_ref=$(wait_end "$ref" 120)
s_cap=$(wait_end "$capped" 60)
s_can=$(wait_end "$cancelled" 60)
check "the reference job completed ($s_ref)" test "$s_ref" = COMPLETED
check "it ran at 2 ranks" grep -q 'ranks=2 ' reference.out
check "the job's output names the build" grep -q "^\[slurm\] .*: seqrec .* (LibTorch " reference.out
# Every evaluation of a run, but for the time it took.
metrics() { sed 's/,"seconds":[0-9.e+-]*//' "$1/metrics.jsonl"; }
for name in requeued requeued-mpirun; do
  job=$run state=$s_run
  [ "$name" = requeued-mpirun ] && job=$run_mpi state=$s_mpi
  check "$name: completed after its requeue ($state)" test "$state" = COMPLETED
  check "$name: restarted once ($(field "$job" Restarts))" test "$(field "$job" Restarts)" = 1
  check "$name: its first start checkpointed and requeued" \
    grep -q "stopped with a checkpoint; requeueing (restart 1)" "$name.out"
  check "$name: its second start resumed from the checkpoint" \
    grep -q "^\[resume\] .*$name/checkpoints/step-" "$name.out"
  check "$name: ran at 2 ranks" grep -q 'ranks=2 ' "$name.out"
  check "$name: its validations and test equal the never-stopped run's" \
    diff <(metrics reference) <(metrics "$name")
  check "$name: tested once (2 protocols)" test "$(grep -c '"split":"test"' "$name/metrics.jsonl")" = 2
done
check "the capped job failed with status 3 ($s_cap, $(field "$capped" ExitCode))" \
  test "$s_cap" = FAILED -a "$(field "$capped" ExitCode)" = 3:0
check "the capped job said why it did not requeue" grep -q "requeued 0 times (SEQREC_MAX_REQUEUES): resubmit" capped.out
check "the capped job kept its checkpoint" test -n "$(ls capped/checkpoints 2> /dev/null)"
check "the cancelled job was cancelled, not requeued ($s_can, restarts $(field "$cancelled" Restarts))" \
  test "$s_can" = CANCELLED -a "$(field "$cancelled" Restarts)" = 0
check "its ranks checkpointed at the TERM before Slurm's SIGKILL" \
  grep -q "^\[stop\] stop requested: checkpoint written at step" cancelled.out

if [ "$fails" -gt 0 ]; then
  for f in reference requeued requeued-mpirun capped cancelled; do
    echo "--- $f.out (last 15 lines)"
    tail -n 15 "$f.out" 2> /dev/null
  done
  echo "--- slurmctld.log (last 20 lines)"
  tail -n 20 "$cluster/log/slurmctld.log"
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
