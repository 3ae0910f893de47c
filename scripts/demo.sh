#!/usr/bin/env bash
# One command on a fresh CPU machine: install, serve the embedded tiny model with the plugin, write out/demo.wav.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/install.sh)
eval "$(bash scripts/register_without_pip.sh "$PWD/.cache/entry-points")"  # this checkout, with its vLLM entry points
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
exec "$venv/bin/python" scripts/demo.py "$@"
