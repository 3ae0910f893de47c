#!/usr/bin/env bash
# On the GPU machine, one call (about 9 minutes): the issue-7 comparison on ONE server run, same workload and
# settings for every mode, switched live over HTTP (`POST /voxserve/mode`): vLLM's stock scheduler with the codec
# inline (`vllm-stock`), our scheduler with the codec inline (`inline`), the codec lanes (`lanes`) and the lanes
# without deadline-aware admission (`lanes+prefill_first`), each by capacity search (each mode's bracket starts at
# the previous mode's capacity, or at its rate in MODE_START_RATES, e.g. vllm-stock=40,lanes=88; MAX_RATE caps the
# doubling). The record is saved after every
# probe, so a run cut short by OURS_T still leaves its probes. EXTRA_SERVE_ARGS: more `vllm serve` arguments (no
# spaces inside one). Results: $OUT/results.tgz.
# Needs vLLM from ../shared/gpu-stack and the plugin on PYTHONPATH (see the README's GPU section).
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/issue7}; mkdir -p "$res"
cfg=${VOXSERVE_CONFIG:-'{"voxserve":{"admin_routes":true,"codec_dtype":"bfloat16","first_chunk_frames":5,"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
SECONDS=0
OUT=$res KEEP_SERVER=1 SERVE_ARGS="--additional-config $cfg ${EXTRA_SERVE_ARGS:-}" \
  ABLATION_ARGS="--modes ${MODES:-vllm-stock,inline,lanes} --strategy search --chain-start --seeds ${SEEDS:-0}
  --search-start-rate ${START_RATE:-16} --window-s ${WINDOW_S:-20} --resolution ${RESOLUTION:-8} --warmup 16
  --time-budget-s ${BUDGET_S:-120} ${MODE_START_RATES:+--mode-start-rates $MODE_START_RATES}
  ${MAX_RATE:+--search-max-rate $MAX_RATE}" \
  timeout -k 5 "${OURS_T:-540}" bash scripts/gpu_serve_smoke.sh > "$res/run.txt" 2>&1
echo "ended at ${SECONDS} s" >> "$res/times.txt"
if [ -e "$res/server.pid" ]; then  # only this script's server: another may run on the other GPU
  pgid=$(cat "$res/server.pid"); kill -- -"$pgid" 2>/dev/null; sleep 5; kill -9 -- -"$pgid" 2>/dev/null
fi
grep -v '"POST /v1/audio/speech HTTP/1.1" 200 OK' "$res/serve.log" > "$res/serve.short" && mv "$res/serve.short" "$res/serve.log"
python3 -m benchmarks.step_log "$res/serve.log" --json "$res/step_log.json" > "$res/step_log.txt" 2>&1  # per window
cat "$res/times.txt"; grep -h "code predictor:\|init engine\|step host time\|codec mode" "$res/serve.log" | cut -c1-220
tar czf "$final_out/results.tgz" -C "$res" .
