#!/usr/bin/env bash
# On a machine with a package index: download vLLM-Omni 0.26.0 (the release built for vLLM 0.26.0) and only the
# wheels its Qwen3-TTS serving path imports beyond the offline vLLM bundle (../shared/gpu-stack) and the GPU host's
# image, each `--no-deps`, for Python 3.12 on manylinux x86_64, into DEST (default .gpu/omni, ignored by git), with
# DEST/manifest.txt (file, bytes, sha256). About 12.5 MB in all: one piece folder, copied to the GPU host as it is
# (`benchmarks/gpu_host/stack_pieces.sh DEST OUT` also cuts it, should a copy be smaller).
#   bash benchmarks/gpu_host/omni_bundle.sh [DEST]
# Why these and no others: importing the `--omni` CLI, its API server, the engine, the shared-memory connector, the
# stage input processors and both Qwen3-TTS stages (talker, code2wav) with vLLM 0.26.0 needs, beyond the bundle and
# the image (transformers, onnxruntime, safetensors, einops, torchaudio, pyyaml, pillow, tiktoken, msgpack ...):
#   diffusers   vllm_omni/diffusion/data.py (`import diffusers`), reached from the API server's chat serving
#   aenum       vllm_omni/patch.py, imported by `vllm_omni/__init__.py`
#   janus       the orchestrator and the async engine (vllm_omni/engine/)
#   omegaconf   vllm_omni/config/yaml_util.py (deploy YAMLs); 2.4 vendors its ANTLR runtime
#   prettytable vllm_omni/metrics/utils.py, reached from the stage config; needs wcwidth
#   loguru      vllm_omni/tokenizers/mammoth_moda2_tokenizer.py, imported eagerly by
#               vllm_omni/transformers_utils/configs/__init__.py (every config module registers itself)
# The package's other requirements (cache-dit, torchsde, openai-whisper, x-transformers, imageio, gguf, fa3-fwd,
# av) serve other models or optional paths and are left out.
set -euo pipefail
dest=${1:-.gpu/omni}
wheels=(
  vllm-omni==0.26.0
  diffusers==0.38.0
  aenum==3.1.16
  janus==2.0.0
  omegaconf==2.4.0
  prettytable==3.19.0
  wcwidth==0.9.4
  loguru==0.7.3
)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for n in 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
rm -rf "$dest"; mkdir -p "$dest"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$dest" "${wheels[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
(cd "$dest" && for f in *.whl; do echo "$f $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"; done) \
  > "$dest/manifest.txt"
[ "$(wc -l < "$dest/manifest.txt")" -eq "${#wheels[@]}" ] || { echo "omni_bundle.sh: expected ${#wheels[@]} wheels" >&2
  cat "$dest/manifest.txt" >&2; exit 1; }
cat "$dest/manifest.txt"
du -sh "$dest"
