#!/usr/bin/env bash
# On the GPU machine (vLLM from ../shared/gpu-stack; see README), about 3 minutes: serve as serve_smoke.sh does,
# with vLLM's torch profiler armed; drive RATE req/s of the LibriTTS workload for WINDOW_S seconds; profile
# PROFILE_ITERS engine steps from the middle of the window; summarize each trace (benchmarks/trace_summary.py:
# device time per kernel and per stream, busy share, idle gaps). Results: $OUT/profile.tgz (summaries, the sweep, the
# server log; the raw traces only when small). The profiler slows the engine while it records (40 steps took 1.9 s of
# trace at 44 req/s, about twice the unprofiled step time, and a backlog built up): read kernel mixes and per-stream
# device time from it, not idle gaps or attainment.
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/profile}; mkdir -p "$res/traces"
port=${PORT:-8000}
cfg=${VOXSERVE_CONFIG:-'{"voxserve":{"codec_dtype":"bfloat16","first_chunk_frames":5,"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
prof='{"profiler":"torch","torch_profiler_dir":"'$res/traces'","torch_profiler_with_stack":false,"ignore_frontend":true,"warmup_iterations":2,"active_iterations":'${PROFILE_ITERS:-30}',"max_iterations":'$(( ${PROFILE_ITERS:-30} + 2 ))'}'
OUT=$res KEEP_SERVER=1 PORT=$port PROBE_ARGS="--concurrency 1" \
  SERVE_ARGS="--additional-config $cfg --profiler-config $prof" \
  timeout -k 5 "${SERVE_T:-900}" bash benchmarks/gpu_host/serve_smoke.sh > "$res/run.txt" 2>&1
# the compiled codec's start-up alone took 4-5 minutes: never load (or profile) a server still starting
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 2; done
window=${WINDOW_S:-30}
python3 -m benchmarks sweep --base-url "http://127.0.0.1:$port" --model qwen3-tts --fixed-length --no-progress \
  --rates "${RATE:-40}" --seeds 0 --window-s "$window" --warmup 16 --out "$res/sweep" >> "$res/run.txt" 2>&1 &
load=$!
sleep $(( window / 2 + 10 ))  # warm-up burst, then half the window
curl -sf -X POST "http://127.0.0.1:$port/start_profile" >> "$res/run.txt" 2>&1; sleep 3
curl -sf -X POST "http://127.0.0.1:$port/stop_profile" >> "$res/run.txt" 2>&1
wait $load
if [ -e "$res/server.pid" ]; then
  pgid=$(cat "$res/server.pid"); kill -- -"$pgid" 2>/dev/null; sleep 5; kill -9 -- -"$pgid" 2>/dev/null
fi
find "$res/traces" -type f -name "*.json*" | while read -r trace; do
  { echo "== $trace"; python3 -m benchmarks.trace_summary "$trace" --top 30; } >> "$res/trace_summary.txt" 2>&1
done
find "$res/traces" -type f -size +20M -delete  # keep the transfer small: the summaries hold what matters
cat "$res/trace_summary.txt" | head -60
tar czf "$final_out/profile.tgz" -C "$res" .
