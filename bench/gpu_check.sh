#!/usr/bin/env bash
# One-shot device check, two tiers, one JSON report each (bench/results/gpu_check_<tier>.json).
#   bench/gpu_check.sh --kernels [--cpu]   torch + nvcc (+ FlashInfer) only, no SGLang needed:
#       builds the extension for the local GPU, checks ops and FlashInfer block attention against
#       torch references, times them.
#   bench/gpu_check.sh --e2e [--cpu]       needs this package and SGLang installed: lossless
#       end-to-end check and ours vs built-in DFLASH vs no speculation at concurrency 1/8/32.
# --cpu runs the same script on CPU with small shapes (CI runs both tiers this way).
set -euo pipefail
cd "$(dirname "$0")/.."
TIER=""; CPU=0
for a in "$@"; do
  case "$a" in
    --kernels) TIER=kernels ;; --e2e) TIER=e2e ;; --cpu) CPU=1 ;;
    *) echo "usage: $0 --kernels|--e2e [--cpu]" >&2; exit 2 ;;
  esac
done
[ -n "$TIER" ] || { echo "usage: $0 --kernels|--e2e [--cpu]" >&2; exit 2; }
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p bench/results
if [ "$TIER" = kernels ]; then
  if [ "$CPU" = 1 ]; then
    "$PY" setup.py -q build_ext --inplace
    exec timeout 480 "$PY" bench/gpu_check.py --device cpu --quick --out bench/results/gpu_check_kernels_cpu.json
  fi
  FORCE_CUDA=1 "$PY" setup.py -q build_ext --inplace   # arch list: the visible GPU's
  exec timeout 480 "$PY" bench/gpu_check.py --device cuda --out bench/results/gpu_check_kernels.json
fi
if [ "$CPU" = 1 ]; then
  exec timeout 900 "$PY" bench/e2e_check.py --device cpu --out bench/results/gpu_check_e2e_cpu.json
fi
exec timeout 480 "$PY" bench/e2e_check.py --device cuda --out bench/results/gpu_check_e2e.json
