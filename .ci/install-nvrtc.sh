#!/usr/bin/env bash
# Installs NVIDIA's NVRTC (run-time CUDA compiler) and the CUDA runtime headers from PyPI into
# .venv, so that backends/cuda/tests/nvrtc_compile.rs can compile every kernel to PTX on a
# machine with no GPU and no CUDA toolkit. Writes .venv/nvrtc.env, which .ci/run sources:
# LD_LIBRARY_PATH gains the folder of libnvrtc.so.12, FT_CUDA_INCLUDE names the headers.
# Idempotent: a .venv that already has the pinned versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

# 12.8, not 12.9: PTX from NVRTC 12.9 needs a >= 12.9 driver, and cudarc is built for 12.8
# (feature cuda-12080). Raise all three together.
NVRTC_VERSION="12.8.93"
RUNTIME_VERSION="12.8.90"

PY="${PYTHON:-python3}"
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  if ! command -v "$PY" >/dev/null 2>&1; then
    echo "install-nvrtc: $PY not found" >&2
    exit 1
  fi
  "$PY" -m venv "$VENV"
fi
want="nvidia-cuda-nvrtc-cu12==${NVRTC_VERSION} nvidia-cuda-runtime-cu12==${RUNTIME_VERSION}"
if ! "$VENV/bin/python" -m pip show nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 2>/dev/null \
  | grep -q "^Version: ${NVRTC_VERSION}$"; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $want
fi

# Both wheels unpack under site-packages/nvidia/cuda_{nvrtc,runtime}/.
nvidia_dir="$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0] + "/x"))')"
lib_dir="$nvidia_dir/cuda_nvrtc/lib"
inc_dir="$nvidia_dir/cuda_runtime/include"
if [ ! -e "$lib_dir/libnvrtc.so.12" ]; then
  echo "install-nvrtc: libnvrtc.so.12 not found in $lib_dir" >&2
  exit 1
fi
# The wheel ships only the versioned name; cudarc's loader also tries the plain one.
[ -e "$lib_dir/libnvrtc.so" ] || ln -sf libnvrtc.so.12 "$lib_dir/libnvrtc.so"
{
  echo "export LD_LIBRARY_PATH=\"$lib_dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  echo "export FT_CUDA_INCLUDE=\"$inc_dir\""
} > .venv/nvrtc.env
echo "install-nvrtc: NVRTC ${NVRTC_VERSION} in $lib_dir; headers in $inc_dir; source .venv/nvrtc.env"
