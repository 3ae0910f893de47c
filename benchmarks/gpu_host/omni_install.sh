#!/usr/bin/env bash
# On the GPU host, after the offline vLLM stack (/opt/vllm-site, /opt/vllm-deps): install the wheels that
# benchmarks/gpu_host/omni_bundle.sh downloaded (SRC, default .gpu/omni; checked against its manifest) with
# `pip install --no-index --no-deps` into TARGET (default /opt/vllm-omni-site, beside the vLLM stack), once, and print
# the environment that serves vLLM-Omni:   eval "$(bash benchmarks/gpu_host/omni_install.sh [SRC])"
# Only for the shell that starts vLLM-Omni (benchmarks/gpu_host/omni_serve.sh evaluates it itself): the wheel
# registers a vLLM general plugin (`vllm_omni_register_models`), so with TARGET on PYTHONPATH every vLLM process would
# load vLLM-Omni; VLLM_PLUGINS names that plugin alone, so that this checkout's plugin stays out of that server.
set -euo pipefail
src=${1:-.gpu/omni} target=${TARGET:-/opt/vllm-omni-site}
if [ ! -e "$target/.done" ]; then
  [ -f "$src/manifest.txt" ] || { echo "omni_install.sh: no $src/manifest.txt (run omni_bundle.sh)" >&2; exit 2; }
  while read -r file size sum; do
    [ "$(sha256sum "$src/$file" | cut -d' ' -f1)" = "$sum" ] \
      || { echo "omni_install.sh: $src/$file does not match its sha256 ($size bytes expected)" >&2; exit 3; }
  done < "$src/manifest.txt"
  mkdir -p "$target"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" \
    $(cut -d' ' -f1 "$src/manifest.txt" | sed "s|^|$src/|") >&2
  touch "$target/.done"
fi
site=/opt/vllm-site deps=/opt/vllm-deps
[ -d "$site/vllm" ] || echo "omni_install.sh: no vLLM under $site (install the offline stack first)" >&2
echo "export PYTHONPATH=$site:$deps:$target\${PYTHONPATH:+:\$PYTHONPATH}"
echo "export VLLM_USE_FLASHINFER_SAMPLER=\${VLLM_USE_FLASHINFER_SAMPLER:-0}"
echo "export VLLM_PLUGINS=vllm_omni_register_models"
echo "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
