#!/usr/bin/env bash
# Carries training runs from one device session to the next, within what a device call brings
# back (files of at most 16 MiB each, a few in all) and what it takes along (the carried paths).
#
#   bench/run_carry.sh pack RUN_DIR... OUT
#       Each run directory's newest checkpoint, its best model, flags.txt, train.log and
#       metrics.jsonl (older checkpoints left out) as OUT/carry-NAME.tgz.NN, parts of 15 MiB.
#   bench/run_carry.sh unpack FROM DEST
#       Joins FROM/carry-NAME.tgz.* back into DEST/NAME for every NAME there.
#
# On this machine, after a call that packed into $OUT:
#   bench/run_carry.sh unpack FILES_AT .devruns
# and carry .devruns with the next call; bench/gpu_session.sh resumes each GPU_RUNS entry whose
# name is a directory in RESUME_DIR (default .devruns) with --resume auto.
set -euo pipefail

die() { echo "run_carry: $*" >&2; exit 1; }

pack() {
  [ $# -ge 2 ] || die "pack needs RUN_DIR... OUT"
  local out=${*: -1}
  mkdir -p "$out"
  local run
  for run in "${@:1:$#-1}"; do
    run=${run%/}
    [ -d "$run" ] || die "no run directory $run"
    local name parent newest
    name=$(basename "$run")
    parent=$(dirname "$run")
    newest=$(ls -1 "$run/checkpoints" 2>/dev/null | sort | tail -1 || true)
    [ -n "$newest" ] || die "$run has no checkpoint to carry"
    local files=("$name/checkpoints/$newest")
    for f in best flags.txt train.log metrics.jsonl; do
      [ -e "$run/$f" ] && files+=("$name/$f")
    done
    rm -f "$out/carry-$name.tgz."*
    tar -czf - -C "$parent" "${files[@]}" | split -b 15m -d -a 2 - "$out/carry-$name.tgz."
    echo "packed $run ($newest): $(ls "$out/carry-$name.tgz."* | wc -l) part(s), $(du -ch "$out/carry-$name.tgz."* | tail -1 | cut -f1)"
  done
}

unpack() {
  [ $# -eq 2 ] || die "unpack needs FROM DEST"
  local from=$1 dest=$2
  mkdir -p "$dest"
  local names
  names=$(ls -1 "$from" | sed -n 's/^carry-\(.*\)\.tgz\.[0-9][0-9]$/\1/p' | sort -u)
  [ -n "$names" ] || die "no carry-NAME.tgz.NN parts in $from"
  local name
  for name in $names; do
    rm -rf "${dest:?}/$name"
    cat "$from/carry-$name.tgz."* | tar -xzf - -C "$dest"
    echo "unpacked $dest/$name"
  done
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  unpack) shift; unpack "$@" ;;
  *) die "usage: run_carry.sh pack RUN_DIR... OUT | unpack FROM DEST" ;;
esac
