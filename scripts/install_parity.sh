#!/usr/bin/env bash
# Make (or reuse) the environment that runs the official Qwen3-TTS code (qwen-tts 0.1.1, transformers 4.57.3) for
# the parity tests, and print its path. VOXSERVE_PARITY_VENV=DIR to choose where.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
hash=$( (cat "$root/requirements/parity.txt"; echo qwen-tts==0.1.1) | sha256sum | cut -c1-12)
venv=${VOXSERVE_PARITY_VENV:-$HOME/.cache/vllm-voxserve/parity-$hash}
if [ ! -e "$venv/.complete" ]; then
  echo "install_parity.sh: building $venv" >&2
  rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -r "$root/requirements/parity.txt" >&2
  "${pip[@]}" --no-deps qwen-tts==0.1.1 >&2
  touch "$venv/.complete"
fi
echo "$venv"
