#!/usr/bin/env bash
# For a host where `pip install -e .` cannot build (no setuptools, no index; e.g. the offline GPU machine):
# write the package's distribution record with its vLLM entry points into DIR, then print the environment to eval.
#   eval "$(bash scripts/register_without_pip.sh /opt/voxserve-ep)"
set -euo pipefail
dir=${1:?usage: register_without_pip.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
rec="$dir/vllm_voxserve-0.1.0.dist-info"
mkdir -p "$rec"
printf 'Metadata-Version: 2.1\nName: vllm-voxserve\nVersion: 0.1.0\n' > "$rec/METADATA"
cat > "$rec/entry_points.txt" <<EOT
[vllm.endpoint_plugins]
voxserve = vllm_voxserve.entrypoints.speech_plugin:SpeechEndpointPlugin

[vllm.general_plugins]
voxserve = vllm_voxserve.plugin:register
EOT
echo "export PYTHONPATH=$dir:$root\${PYTHONPATH:+:\$PYTHONPATH}"
