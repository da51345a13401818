#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment and prints its path.
#
# Idempotent and quick when nothing changed: a stamp of the install inputs is kept in the
# environment, so the README's commands can call this every time.
#
# PyTorch: a torch already importable in the environment is kept as it is. Otherwise
# KVTIER_TORCH (a pip requirement) is installed when set; else, with no NVIDIA GPU visible,
# the pinned CPU build (torch==2.13.0); with a GPU, the registry's default (CUDA) build.
#
# --vllm (or KVTIER_VLLM=1): also vLLM 0.33.0 for kvtier.integrations.vllm and its tests. With
# a GPU, `pip install kvtier[vllm]` (vLLM with its own requirements); without one, vLLM with
# --no-deps plus what its offloading code imports (the `vllm-cpu` extra), so torch stays the
# CPU build. Run vLLM on CPU with VLLM_TARGET_DEVICE=cpu.
set -euo pipefail

with_vllm=${KVTIER_VLLM:-0}
for argument in "$@"; do
    case "$argument" in
    --vllm) with_vllm=1 ;;
    *)
        echo "setup: unknown argument $argument (usage: scripts/setup.sh [--vllm])" >&2
        exit 2
        ;;
    esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KVTIER_VENV:-"$root/.venv"}
cpu_torch="torch==2.13.0"

find_python() {
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "setup: kvtier needs Python >= 3.11; none found on PATH (set PYTHON=...)" >&2
    return 1
}

if [ ! -x "$venv/bin/python" ]; then
    python=$(find_python)
    echo "setup: creating virtual environment $venv" >&2
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check -q)
stamp="$venv/.kvtier-setup-stamp"
vllm_stamp="$venv/.kvtier-vllm-stamp"
# One stamp of the install inputs for the project, one for vLLM: a run without --vllm neither
# needs nor removes vLLM, so switching between scripts/kvtier and scripts/test reinstalls nothing.
want=$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1)
project_ok=0
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import kvtier, torch' 2>/dev/null; then
    project_ok=1
fi
vllm_ok=1
if [ "$with_vllm" = 1 ]; then
    if ! { [ -f "$vllm_stamp" ] && [ "$(cat "$vllm_stamp")" = "$want" ] &&
        "$py" -c 'import vllm' 2>/dev/null; }; then
        vllm_ok=0
    fi
fi
if [ "$project_ok" = 1 ] && [ "$vllm_ok" = 1 ]; then
    echo "$venv"
    exit 0
fi

# pip's resolver reports vLLM's exact pins (torch, ...) as conflicts on every install: vLLM is
# installed --no-deps on purpose (its CPU use here needs only the offloading code), so those
# lines are noise to a user; every other line of pip's output is kept.
quiet_pins() {
    grep -v -E "^(vllm [0-9.]+ requires |ERROR: pip's dependency resolver does not currently)" >&2 || true
}

if [ "$project_ok" = 0 ]; then
    if ! "$py" -c 'import torch' 2>/dev/null; then
        if [ -n "${KVTIER_TORCH:-}" ]; then
            torch_req=$KVTIER_TORCH
        elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            torch_req=torch
        else
            torch_req=$cpu_torch
        fi
        echo "setup: installing $torch_req" >&2
        "${pip[@]}" install "$torch_req" >&2
    fi
    echo "setup: installing kvtier (editable) with its test and plot tools" >&2
    "${pip[@]}" install -e "$root[test,torch,plot]" 2>&1 | quiet_pins
    echo "$want" >"$stamp"
fi
if [ "$vllm_ok" = 0 ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "setup: installing vLLM 0.33.0 (GPU build, with its requirements)" >&2
        "${pip[@]}" install -e "$root[vllm]" 2>&1 | quiet_pins
    else
        echo "setup: installing vLLM 0.33.0 for CPU (--no-deps, plus what it imports)" >&2
        "${pip[@]}" install --no-deps "vllm==0.33.0" 2>&1 | quiet_pins
        "${pip[@]}" install -e "$root[vllm-cpu]" "$("$py" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])')" 2>&1 | quiet_pins
    fi
    echo "$want" >"$vllm_stamp"
fi
echo "$venv"
