#!/usr/bin/env bash
# Pack FlashInfer for a lent GPU machine whose image lacks it and which cannot download: its wheel
# (65 MB) is over the device tool's 64 MiB carry limit, so this keeps the sources its JIT builds for
# our attention and sampling checks (data/include, cccl, cutlass/include, spdlog, csrc's top-level
# files) and drops the MoE / cake / experimental kernel sources: ~13 MB xz, plus apache-tvm-ffi.
#   bench/checks/pack_flashinfer.sh [OUT_DIR]   (default .whl, which .git/info/exclude should list)
# On the device (carry OUT_DIR), before bench/checks/gpu_check.sh --kernels:
#   mkdir -p /tmp/fi && tar -C /tmp/fi -xJf .whl/fi.tar.xz && python3 -m pip install -q --no-index \
#     --no-deps --target /tmp/site .whl/apache_tvm_ffi*.whl && export PYTHONPATH=/tmp/fi:/tmp/site
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-.whl}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
FI=$("$PY" -c 'import importlib.metadata as m; print(m.version("flashinfer-python"))')
TVM=$("$PY" -c 'import importlib.metadata as m; print(m.version("apache-tvm-ffi"))')
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$TMP" \
  "flashinfer-python==$FI" "apache-tvm-ffi==$TVM"
(cd "$TMP" && unzip -q flashinfer_python-*.whl 'flashinfer/*' 'flashinfer_python-*.dist-info/*')
find "$TMP/flashinfer/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
rm -rf "$TMP/flashinfer/data/cutlass/examples"
find "$TMP/flashinfer" -path "$TMP/flashinfer/data" -prune -o -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.cubin' \) -print0 | xargs -0 rm -f
tar -C "$TMP" -cf - flashinfer flashinfer_python-"$FI".dist-info | xz -T2 -6 > "$OUT/fi.tar.xz"
mv "$TMP"/apache_tvm_ffi-*.whl "$OUT/"
ls -la "$OUT"
