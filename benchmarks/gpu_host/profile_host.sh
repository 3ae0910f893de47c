#!/usr/bin/env bash
# On the GPU machine (vLLM from ../shared/gpu-stack, see README; py-spy among the carried wheels:
# `pip download py-spy==0.4.0 --no-deps -d .gpu/wheels`): where the host's time goes under load. Serve as
# serve_smoke.sh does, drive RATE req/s of the LibriTTS workload for WINDOW_S s in the server's default codec mode,
# sample the Python stacks of the engine core and of the API server with py-spy for PROFILE_S s from the middle of
# that window (summaries by benchmarks/host_profile.py), then, with ABLATION_ARGS, run the benchmark suite's ablation
# on the same server. py-spy reads the stacks from outside (--nonblocking: the server is not paused), so the step log
# of the window stays usable. Results: $OUT/results.tgz.
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/host_profile}; mkdir -p "$res/stacks"
port=${PORT:-8000}
cfg=${VOXSERVE_CONFIG:-'{"voxserve":{"codec_dtype":"bfloat16","first_chunk_frames":5,"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
SECONDS=0
OUT=$res KEEP_SERVER=1 PORT=$port PROBE_ARGS="--concurrency 1" SERVE_ARGS="--additional-config $cfg" \
  timeout -k 5 "${SERVE_T:-600}" bash benchmarks/gpu_host/serve_smoke.sh > "$res/run.txt" 2>&1
echo "served at ${SECONDS} s" >> "$res/times.txt"
spy=$(command -v py-spy || echo /opt/vox-wheels/bin/py-spy)
engine=$(grep -o "EngineCore pid=[0-9]*" "$res/serve.log" | head -1 | cut -d= -f2)
api=$(grep -o "APIServer pid=[0-9]*" "$res/serve.log" | head -1 | cut -d= -f2)
window=${WINDOW_S:-40}
python3 -m benchmarks sweep --base-url "http://127.0.0.1:$port" --model qwen3-tts --fixed-length --no-progress \
  --rates "${RATE:-60}" --seeds 0 --window-s "$window" --warmup 16 --out "$res/sweep" >> "$res/run.txt" 2>&1 &
load=$!
sleep $(( window / 2 ))
for who in engine api; do
  timeout 60 "$spy" record --pid "${!who}" --duration "${PROFILE_S:-10}" --rate 250 --format raw --nolineno \
    --threads --nonblocking --output "$res/stacks/$who.txt" > "$res/stacks/$who.log" 2>&1 &
done
wait $load
wait
echo "profiled at ${SECONDS} s" >> "$res/times.txt"
for who in engine api; do
  python3 -m benchmarks.host_profile "$res/stacks/$who.txt" --top 40 > "$res/stacks/$who.summary.txt" 2>&1
done
if [ -n "${ABLATION_ARGS:-}" ]; then
  python3 -m benchmarks ablation --base-url "http://127.0.0.1:$port" --model qwen3-tts --fixed-length \
    --no-progress --out "$res/ablation" $ABLATION_ARGS >> "$res/run.txt" 2>&1
fi
echo "ended at ${SECONDS} s" >> "$res/times.txt"
if [ -e "$res/server.pid" ]; then
  pgid=$(cat "$res/server.pid"); kill -- -"$pgid" 2>/dev/null; sleep 5; kill -9 -- -"$pgid" 2>/dev/null
fi
grep -v '"POST /v1/audio/speech HTTP/1.1" 200 OK' "$res/serve.log" > "$res/serve.short" && mv "$res/serve.short" "$res/serve.log"
python3 -m benchmarks.step_log "$res/serve.log" --json "$res/step_log.json" > "$res/step_log.txt" 2>&1
cat "$res/times.txt"; head -30 "$res/stacks/engine.summary.txt"
tar czf "$final_out/results.tgz" -C "$res" .
