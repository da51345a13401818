#!/usr/bin/env bash
# Installs vLLM 0.33.0, without its dependency tree, into the project's virtual environment, so
# that benchmarks/bookkeeping.py can compare kvtier with vLLM's CPU offloading policies.
#
# Only vLLM's pure-Python policy modules are used (vllm/v1/kv_offload/cpu/policies/*); they
# import vllm.v1.kv_offload.base, which needs torch, numpy, msgspec and packaging. torch and
# numpy come with kvtier's own set-up (scripts/setup.sh); msgspec and packaging are added here.
# `--no-deps` keeps vLLM's heavy requirements (transformers, CUDA kernels, ...) out: the rest of
# vLLM will not import, and nothing here needs it.
#
# Usage: benchmarks/install-vllm-reference.sh            # into $VENV, default <repo>/.venv
#        VENV=/path/to/venv benchmarks/install-vllm-reference.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-"$root/.venv"}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
    echo "install-vllm-reference: no Python at $py (run scripts/setup.sh first, or set VENV)" >&2
    exit 1
fi
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
    echo "install-vllm-reference: torch and numpy must be importable in $venv (scripts/setup.sh)" >&2
    exit 1
fi

"$py" -m pip install --disable-pip-version-check "vllm==0.33.0" --no-deps msgspec packaging

"$py" - <<'PY'
import vllm
from vllm.v1.kv_offload.cpu.policies import arc, lru  # noqa: F401  (what the benchmark needs)

print(f"install-vllm-reference: vLLM {vllm.__version__} policies import fine")
PY
