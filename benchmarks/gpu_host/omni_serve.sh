#!/usr/bin/env bash
# On the GPU host (offline vLLM stack installed and `source benchmarks/gpu_host/env.sh .gpu` done; vLLM-Omni's wheels
# in .gpu/omni from benchmarks/gpu_host/omni_bundle.sh): the peer server for the same measurements. Stages in STAGES
# (default "serve probe"), results under $OUT (default out/omni):
#   serve   make the random 1.7B CustomVoice checkpoint in the official layout (the maker serve_smoke.sh uses), then
#           serve it with vLLM-Omni 0.26.0's shipped Qwen3-TTS deployment, vllm_omni/deploy/qwen3_tts.yaml (talker
#           and code2wav as two stages on GPU 0, 0.3 of its memory each, shared-memory chunk streaming, CUDA graphs),
#           started as its documentation does: `vllm serve MODEL --omni --deploy-config .../qwen3_tts.yaml
#           --trust-remote-code` (here `python3 -m vllm_omni.entrypoints.cli.main`, the `vllm-omni` entry point,
#           since the offline stack installs no scripts); waits for /health. KEEP_SERVER=1 leaves it running for a
#           later call; OMNI_ARGS adds flags (e.g. --enforce-eager, which the docs' quick start also shows).
#   probe   one burst of 1, 4, 8, 16 and 32 simultaneous streams (stream_probe.py): TTFA and frames received
#   sweep   the benchmark suite's open-loop sweep at RATES (default 1,2,3,4,6,8) with the `vllm-omni` profile
#   search  its capacity search at 90 % and 99 % (SEARCH_ARGS, default "--window-s 20 --start-rate 2 --resolution 0.5")
#   concurrency  the suite's closed loop, as vLLM-Omni's published table measures: LEVELS (1,4,8,16,32) requests in
#           flight, PER_LEVEL (32) requests each, one seed (CONCURRENCY_ARGS adds options, e.g. --time-budget-s 200)
#   stop    stop the server this script started (its process group, from $OUT/server.pid)
#
# How lengths are matched. vLLM-Omni's speech request (vllm_omni/entrypoints/openai/protocol/audio.py:132) has
# `max_new_tokens` (1..4096, tts_adapters/base.py:109), which for Qwen3-TTS becomes the talker's max_tokens
# (serving_speech.py:3393): one token is one 12.5 Hz frame, 1920 samples at 24 kHz. It has no `ignore_eos` and no
# per-request minimum: `extra_params` sets only temperature/top_p/top_k on the sampling parameters
# (serving_speech.py:3370), the pipeline fixes codec EOS 2150 as a stop token (models/qwen3_tts/pipeline.py:33) and
# the deploy YAML sets min_tokens 2. So the `vllm-omni` profile with --fixed-length sends max_new_tokens = the frame
# count our server streams for the same text (no +1 offset) and the length is a cap: a random-weight talker may sample
# EOS sooner. Each request's received audio is in the records (and `frames` in probe.json): compare it with the
# requested frames before putting the two servers side by side. The schema also has `seed`, which the profile does
# not send (the talker samples at temperature 0.9, top-k 50, as shipped).
set -euo pipefail
out=${OUT:-out/omni}; mkdir -p "$out"
ckpt=${CKPT:-/tmp/qwen3-tts-1.7b-customvoice-random}
port=${PORT:-8091}; url=http://127.0.0.1:$port
target=${TARGET:-/opt/vllm-omni-site}
for stage in ${STAGES:-serve probe}; do
  case $stage in
  serve)
    if [ ! -e "$ckpt/speech_tokenizer/config.json" ]; then
      python3 -m vllm_voxserve.models.qwen3_tts.checkpoint --out "$ckpt" --size 1.7b --kind custom_voice \
        --dtype bfloat16 --device "${CKPT_DEVICE:-cuda}" > "$out/checkpoint.log" 2>&1 \
        || [ -e "$ckpt/speech_tokenizer/config.json" ] || { tail -20 "$out/checkpoint.log"; exit 1; }
    fi
    [ -e "$ckpt/vocab.json" ] || cp "${TOKENIZER_DIR:-.gpu/tokenizer}"/* "$ckpt"/
    if curl -sf "$url/health" > /dev/null; then
      echo "reusing the server already on port $port" | tee "$out/reused.txt"; continue
    fi
    # vLLM-Omni only in the server's environment: its wheel registers a vLLM plugin (see omni_install.sh)
    omni_env=$(bash benchmarks/gpu_host/omni_install.sh "${OMNI_DIR:-.gpu/omni}")
    deploy=${OMNI_DEPLOY:-$target/vllm_omni/deploy/qwen3_tts.yaml}
    cp "$deploy" "$out/deploy.yaml"
    { df -h /dev/shm; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; } > "$out/host.txt" 2>&1 \
      || true
    started=$(date +%s)
    # setsid: with KEEP_SERVER=1 the server outlives this script
    (eval "$omni_env"; exec setsid python3 -m vllm_omni.entrypoints.cli.main serve "$ckpt" --omni \
      --deploy-config "$deploy" --port "$port" --served-model-name qwen3-tts --trust-remote-code ${OMNI_ARGS:-}) \
      > "$out/serve.log" 2>&1 &
    pid=$!; echo $pid > "$out/server.pid"
    [ -n "${KEEP_SERVER:-}" ] || trap 'kill -- -$pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
    until curl -sf "$url/health" > /dev/null; do
      kill -0 $pid 2>/dev/null || { echo "server died"; tail -60 "$out/serve.log"; exit 1; }
      [ $(( $(date +%s) - started )) -lt "${START_TIMEOUT_S:-1200}" ] || { echo "no health"; tail -60 "$out/serve.log"
        exit 1; }
      sleep 2
    done
    echo "healthy after $(( $(date +%s) - started )) s" | tee "$out/startup.txt" ;;
  probe)
    python3 benchmarks/gpu_host/stream_probe.py --url "$url" --model qwen3-tts --out "$out/probe.json" \
      --concurrency 1 4 8 16 32 ${PROBE_ARGS:-} ;;
  sweep)
    python3 -m benchmarks sweep --base-url "$url" --profile vllm-omni --server-name vllm-omni --model qwen3-tts \
      --fixed-length --rates "${RATES:-1,2,3,4,6,8}" --no-progress --out "$out/sweep" ${SWEEP_ARGS:-} ;;
  search)
    python3 -m benchmarks search --base-url "$url" --profile vllm-omni --server-name vllm-omni --model qwen3-tts \
      --fixed-length --no-progress --out "$out/search" ${SEARCH_ARGS:---window-s 20 --start-rate 2 --resolution 0.5} ;;
  concurrency)
    python3 -m benchmarks concurrency --base-url "$url" --profile vllm-omni --server-name vllm-omni --model qwen3-tts \
      --fixed-length --no-progress --stop-fraction 0 --seeds 0 --levels "${LEVELS:-1,4,8,16,32}" \
      --requests-per-level "${PER_LEVEL:-32}" --warmup 8 --out "$out/concurrency" ${CONCURRENCY_ARGS:-} ;;
  stop)
    [ -e "$out/server.pid" ] && { kill -- -"$(cat "$out/server.pid")" 2>/dev/null || true; sleep 5; } ;;
  *) echo "unknown stage $stage (serve, probe, sweep, search, concurrency, stop)" >&2; exit 2 ;;
  esac
done
