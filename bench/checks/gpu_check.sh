#!/usr/bin/env bash
# One-shot device check. Reports go to the folder named by --out DIR (default bench/checks/reports).
#   bench/checks/gpu_check.sh [--out DIR]          in one go within 9 minutes, no SGLang needed (torch,
#       nvcc, transformers; FlashInfer imported, or unpacked from .whl/ as pack_flashinfer.sh packs it):
#       the kernels tier (builds the extension for the local GPU, the ops and FlashInfer block attention
#       against torch references, timed; DIR/gpu_check_kernels.json), then the loop tier (loop_check.py:
#       random-weight transformers targets drafted by our pipeline/ through CUDA graphs at every bucket x
#       width, greedy output token-identical to the target's own; DIR/loop_check.jsonl). Exit 0: both passed.
#   bench/checks/gpu_check.sh --dry-run           the same on CPU (the CPU twin where CUDA is needed: graphs
#       eager, torch attention, tiny targets); CI runs it (python_tests/test_gpu_check_dry_run.py).
#   bench/checks/gpu_check.sh --kernels|--loop    one tier (with --cpu: on CPU).
#   bench/checks/gpu_check.sh --e2e [--cpu]       needs SGLang (make gpu-check): lossless end-to-end and
#       ours vs built-in DFLASH vs no speculation at concurrency 1/8/32/64 (DIR/gpu_check_e2e.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
TIER=all; CPU=0; OUT=bench/checks/reports
while [ $# -gt 0 ]; do
  case "$1" in
    --kernels) TIER=kernels ;; --loop) TIER=loop ;; --e2e) TIER=e2e ;; --cpu|--dry-run) CPU=1 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--kernels|--loop|--e2e] [--cpu|--dry-run] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's package, installed or not
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=540   # seconds for both tiers: the lent box gives a check about 9 minutes
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

unpack_flashinfer() {   # the lent box has no FlashInfer and no network: use the packed one when carried
  "$PY" -c 'import flashinfer' 2>/dev/null && return 0
  [ -f .whl/fi.tar.xz ] || { echo "gpu_check: FlashInfer not importable and no .whl/fi.tar.xz (pack_flashinfer.sh)" >&2; return 0; }
  mkdir -p /tmp/fi /tmp/site && tar -C /tmp/fi -xJf .whl/fi.tar.xz
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/apache_tvm_ffi*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/fi:/tmp/site"
}

kernels() {
  if [ "$CPU" = 1 ]; then
    "$PY" setup.py -q build_ext --inplace
    timeout 480 "$PY" bench/checks/gpu_check.py --device cpu --quick --out "$OUT/gpu_check_kernels_cpu.json"
    return
  fi
  # FlashInfer's JIT modules (one per attention case, one for sampling) build side by side with the
  # extension; a failed warm-up is only slower, the check itself then reports the error.
  local n; n=$("$PY" -c 'import sys; sys.path.insert(0, "bench/checks"); import gpu_check; print(len(gpu_check.GPU_CASES) + 1)')
  for i in $(seq 0 $((n - 1))); do "$PY" bench/checks/gpu_check.py --warm "$i" >/dev/null 2>&1 & done
  MAX_JOBS=${MAX_JOBS:-$(nproc)} FORCE_CUDA=1 "$PY" setup.py -q build_ext --inplace   # arch list: the visible GPU's
  wait
  timeout "${1:-480}" "$PY" bench/checks/gpu_check.py --device cuda --out "$OUT/gpu_check_kernels.json"
}

loop() {   # $1: seconds it may take; its shapes stop 30 s before that (skipped shapes fail the tier)
  local t=${1:-480}
  if [ "$CPU" = 1 ]; then
    timeout "$t" "$PY" bench/checks/loop_check.py --dry-run --out "$OUT" --budget-s $(( t - 30 ))
    return
  fi
  timeout "$t" "$PY" bench/checks/loop_check.py --out "$OUT" --budget-s $(( t - 30 ))
}

e2e() {
  if [ "$CPU" = 1 ]; then
    timeout 900 "$PY" bench/checks/e2e_check.py --device cpu --out "$OUT/gpu_check_e2e_cpu.json"
    return
  fi
  timeout "${1:-480}" "$PY" bench/checks/e2e_check.py --device cuda --out "$OUT/gpu_check_e2e.json"
}

[ "$CPU" = 1 ] || unpack_flashinfer
case "$TIER" in
  kernels) kernels ;;
  loop) loop ;;
  e2e) e2e ;;
  all)
    rc=0
    kernels 300 || rc=$?
    loop "$(( $(left) - 10 ))" || rc=$?
    echo "gpu_check: $( [ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc)" ) in $(( $(date +%s) - START )) s"
    exit "$rc"
    ;;
esac
