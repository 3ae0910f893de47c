#!/usr/bin/env bash
# One command on a fresh CPU machine: install both environments and run the whole test suite (GPU tests skip
# without CUDA). Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not server"`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/install.sh)
eval "$(bash scripts/register_without_pip.sh "$PWD/.cache/entry-points")"  # this checkout, with its vLLM entry points
bash scripts/install_parity.sh > /dev/null  # the official qwen-tts 0.1.1 environment for the parity tests
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
