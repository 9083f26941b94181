#!/usr/bin/env bash
# The drafter's levers as arms at an equal budget, from nothing on a fresh machine (docs/training.md,
# "Levers at an equal budget"). Every stage is resumable: rerun the same command after a stop.
#
#   bench/drafter_levers.sh WORKDIR [MINUTES_PER_ARM] [ARM ...]
#
# 1. unseen: 220 prompts of kinds no training run reads (C headers, JavaScript, Python reference
#    topics, chat questions; bench/unseen_set.py --fresh), the target's greedy answers, features.
# 2. data: the corpus documents (argmax labels, with the target's top-32 for distillation) and
#    1,000 templated prompts answered by the target; the two datagen shards run side by side, one
#    plain and one through DFLASH (same chains), so their answer tokens/s compare the two.
# 3. arms, each MINUTES_PER_ARM of training (one at a time, two threads), warm-started from the
#    shipped drafter: recipe (its last warm start's settings), grow4 (4 layers grown from it, copy
#    init), distil (--distil 0.5), shape (gamma 7, 32 anchors x 4 sequences per step), dflash2 (DFlash 2
#    grown from it: convolutions and the path selector trained, train/dflash2.py), long (the same data
#    plus the target's answers to long prompts: a whole installed file or document, then a question,
#    train/long_prompts.py; several hundred to ~1,300 tokens of prompt before each answer), dflash2-long
#    (the two together), followup (the same data plus a second turn after each templated answer:
#    the earlier conversation, the target's own answer, a follow-up question; train/followup_prompts.py),
#    distil-t1 / distil-t07 (pure distillation to the stored top-32 at T = 1 / 0.7: judged on the
#    sampled walk, train/tempered_distil.py). SIDE_BY_SIDE=1 trains the arms at once, one core and
#    one thread each (two arms on this 2-core host: each arm's minutes are wall minutes on one core).
# 4. bench/drafter_arms.py over parent + arms on the templated held-out answers and the unseen set
#    (SKIP_WALKS=1: arms only; a later run with the same WORKDIR walks them all).
set -euo pipefail
W=${1:?usage: bench/drafter_levers.sh WORKDIR [MINUTES_PER_ARM] [ARM ...]}
M=${2:-10}
shift $(($# < 2 ? $# : 2))
ARMS=${*:-recipe grow4 distil shape}
PY=${PYTHON:-.venv/bin/python}
PARENT=sglang_dflash/drafters/smollm2-135m-instruct-dflash
T="$PY -m sglang_dflash.train"
mkdir -p "$W"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

log unseen set
OMP_NUM_THREADS=1 $PY bench/unseen_set.py --fresh --per-family 55 --out "$W/unseen"

log corpus + templated answers
$T corpus --workdir "$W/data"
if [ ! -e "$W/data/datagen.done" ]; then
  OMP_NUM_THREADS=1 $T datagen --workdir "$W/data" --n 1000 --seed 9 --shard 0 --shards 2 \
    --datagen-minutes 30 > "$W/data/datagen.0.log" 2>&1 &
  OMP_NUM_THREADS=1 $T datagen --workdir "$W/data" --n 1000 --seed 9 --shard 1 --shards 2 \
    --datagen-minutes 30 --datagen-draft "$PARENT" > "$W/data/datagen.1.log" 2>&1
  wait
  touch "$W/data/datagen.done"
fi
grep -h '^datagen: {' "$W"/data/datagen.*.log >&2 || true
if [ ! -e "$W/data/features.done" ]; then  # once: a rerun must not grow the arms' data
  $T features --workdir "$W/data" --features-minutes 12 --min-train-minutes 0
  touch "$W/data/features.done"
fi

# Answers to extra prompts ($2 ...: datagen's prompt arguments) into workdir $1, two shards side by
# side, both through DFLASH (same chains), then their features; once per workdir.
extra_answers() {
  local d=$1
  shift
  [ -e "$d/features.done" ] && return
  mkdir -p "$d"
  for s in 0 1; do
    OMP_NUM_THREADS=1 $T datagen --workdir "$d" "$@" --seed 9 --shard $s --shards 2 --datagen-minutes 12 \
      --datagen-draft "$PARENT" > "$d/datagen.$s.log" 2>&1 &
  done
  wait
  $T features --workdir "$d" --features-minutes 12 --min-train-minutes 0 --no-text
  touch "$d/features.done"
}
if [[ " $ARMS " == *" long "* || " $ARMS " == *" dflash2-long "* ]]; then
  log "long-prompt answers (a whole installed file or document, then a question) + their features"
  extra_answers "$W/long" --prompts long --n 320
fi
if [[ " $ARMS " == *" followup "* ]]; then
  log "second turns after the templated answers (followup_prompts.py) + their features"
  extra_answers "$W/followup" --prompts followup --followup-of "$W/data" --n 1000
fi

pids=()
COMMON=(--seed 9 --keep-draft-vocab --lr 3e-4 --warmup-steps 200 --ckpt-minutes 3)
for arm in $ARMS; do
  A="$W/arm-$arm"
  [ -e "$A/train_summary.json" ] && { log "arm $arm: done"; continue; }
  mkdir -p "$A"
  ln -sfn "$(cd "$W/data" && pwd)/features" "$A/features"
  init=$PARENT
  extra=()
  case $arm in
    recipe) ;;
    grow4) $T grow --drafter "$PARENT" --num-layers 4 --grow-init copy --out "$W/grow4"
           init=$W/grow4; extra=(--num-layers 4) ;;
    distil) extra=(--distil 0.5) ;;
    distil-t1) extra=(--distil 1.0) ;;  # pure KL(p || q) to the stored top-32: the T = 1 sampled walk's target
    distil-t07) extra=(--distil 1.0 --distil-temperature 0.7) ;;  # the same at T = 0.7 (tempered_distil.py)
    shape) extra=(--gamma 7 --anchors 32 --seqs 4) ;;
    long) extra=(--extra-features "$W/long") ;;  # the same data plus the long-prompt answers
    followup) extra=(--extra-features "$W/followup") ;;  # the same data plus second turns after its answers
    dflash2) $T dflash2 --drafter "$PARENT" --out "$W/dflash2"   # identity convolutions, a zero selector
             init=$W/dflash2 ;;
    dflash2-long) $T dflash2 --drafter "$PARENT" --out "$W/dflash2"  # DFlash 2 on the long-prompt answers too
                  init=$W/dflash2; extra=(--extra-features "$W/long") ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
  log "arm $arm: $M minutes"
  if [ "${SIDE_BY_SIDE:-0}" = 1 ]; then
    OMP_NUM_THREADS=1 $T train --workdir "$A" --init-from "$init" "${COMMON[@]}" --train-minutes "$M" \
      --threads 1 "${extra[@]}" > "$A/train.log" 2>&1 &
    pids+=($!)
  else
    $T train --workdir "$A" --init-from "$init" "${COMMON[@]}" --train-minutes "$M" "${extra[@]}" \
      > "$A/train.log" 2>&1
  fi
done
for p in "${pids[@]}"; do wait "$p"; done  # a failed arm stops the script

[ "${SKIP_WALKS:-0}" = 1 ] && { log "walks skipped (SKIP_WALKS=1)"; exit 0; }
log walks
cands=(parent="$PARENT")
for arm in $ARMS; do cands+=("$arm=$W/arm-$arm/ckpt/last.pt"); done
OMP_NUM_THREADS=1 $PY bench/drafter_arms.py --workdir "$W/data" "$W/unseen" --set-names templated unseen \
  --label "levers at an equal budget ($M min each, warm starts of the shipped drafter): $ARMS" -- "${cands[@]}"
