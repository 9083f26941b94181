#!/usr/bin/env bash
# One-shot device check, two tiers, one JSON report each (bench/checks/reports/gpu_check_<tier>.json).
#   bench/checks/gpu_check.sh                      both tiers in one go, within 10 minutes (kernels first):
#       the e2e tier runs only when SGLang imports (its report then says why not, and the exit
#       status is 3); exit 0 only when every tier that ran passed and the e2e tier ran.
#   bench/checks/gpu_check.sh --kernels [--cpu]   torch + nvcc (+ FlashInfer) only, no SGLang needed:
#       builds the extension for the local GPU, checks ops and FlashInfer block attention against
#       torch references, times them.
#   bench/checks/gpu_check.sh --e2e [--cpu]       needs this package and SGLang installed: lossless
#       end-to-end check and ours vs built-in DFLASH vs no speculation at concurrency 1/8/32/64.
# --cpu runs the same script on CPU with small shapes (CI runs both tiers this way).
set -euo pipefail
cd "$(dirname "$0")/../.."
TIER=all; CPU=0
for a in "$@"; do
  case "$a" in
    --kernels) TIER=kernels ;; --e2e) TIER=e2e ;; --cpu) CPU=1 ;;
    *) echo "usage: $0 [--kernels|--e2e] [--cpu]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's package, installed or not
mkdir -p bench/checks/reports
START=$(date +%s)
left() { echo $(( 600 - ($(date +%s) - START) )); }   # seconds of the 10-minute budget left

kernels() {
  if [ "$CPU" = 1 ]; then
    "$PY" setup.py -q build_ext --inplace
    timeout 480 "$PY" bench/checks/gpu_check.py --device cpu --quick --out bench/checks/reports/gpu_check_kernels_cpu.json
    return
  fi
  # FlashInfer's JIT modules (one per attention case, one for sampling) build side by side with the
  # extension; a failed warm-up is only slower, the check itself then reports the error.
  local n; n=$("$PY" -c 'import sys; sys.path.insert(0, "bench/checks"); import gpu_check; print(len(gpu_check.GPU_CASES) + 1)')
  for i in $(seq 0 $((n - 1))); do "$PY" bench/checks/gpu_check.py --warm "$i" >/dev/null 2>&1 & done
  MAX_JOBS=${MAX_JOBS:-$(nproc)} FORCE_CUDA=1 "$PY" setup.py -q build_ext --inplace   # arch list: the visible GPU's
  wait
  timeout "${1:-480}" "$PY" bench/checks/gpu_check.py --device cuda --out bench/checks/reports/gpu_check_kernels.json
}

e2e() {
  if [ "$CPU" = 1 ]; then
    timeout 900 "$PY" bench/checks/e2e_check.py --device cpu --out bench/checks/reports/gpu_check_e2e_cpu.json
    return
  fi
  timeout "${1:-480}" "$PY" bench/checks/e2e_check.py --device cuda --out bench/checks/reports/gpu_check_e2e.json
}

case "$TIER" in
  kernels) kernels ;;
  e2e) e2e ;;
  all)
    rc=0
    kernels 300 || rc=$?
    if why=$("$PY" -c "import sglang" 2>&1); then
      e2e "$(( $(left) - 10 ))" || rc=$?
    else
      echo "gpu_check e2e: NOT RUN (SGLang does not import: ${why##*$'\n'})" >&2
      "$PY" -c 'import json, sys; json.dump({"tier": "e2e", "ok": False, "not_run": sys.argv[1]}, open("bench/checks/reports/gpu_check_e2e.json", "w"))' "SGLang does not import: ${why##*$'\n'}"
      [ "$rc" = 0 ] && rc=3
    fi
    echo "gpu_check: $( [ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc)" ) in $(( $(date +%s) - START )) s"
    exit "$rc"
    ;;
esac
