#!/usr/bin/env bash
# On the GPU machine, one call (about 9 minutes): the issue-7 comparison on one host, same workload and settings.
#   1. our server (`--plugin voxserve`): capacity search of the codec modes in $MODES (switched live), then
#   2. the same checkpoint and config under vLLM's stock AsyncScheduler (`--scheduler-cls`), codec inline: search.
# Each part has a wall-clock limit (OURS_T, STOCK_T seconds) and a search time budget per mode (BUDGET_S); the
# records are saved after every probe, so a part cut short still leaves its probes. Results: $OUT/results.tgz.
# Needs vLLM from ../shared/gpu-stack and the plugin on PYTHONPATH (see the README's GPU section).
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/issue7}; mkdir -p "$res"
modes=${MODES:-lanes,inline}
cfg=${VOXSERVE_CONFIG:-'{"voxserve":{"codec_dtype":"bfloat16","first_chunk_frames":5,"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
ours_cfg=${OURS_CONFIG:-$cfg}  # e.g. with "lanes":{"lm_partition":true}; the stock run always uses $cfg
search="--window-s ${WINDOW_S:-20} --resolution ${RESOLUTION:-8} --warmup 16 --time-budget-s ${BUDGET_S:-120}"
serve_pat="cli.main"" serve"; bench_pat="benchmarks"" (ablation|search)"  # split: never match this script's line
stop_all() { pkill -f "$serve_pat"; pkill -f -E "$bench_pat"; sleep 4; pkill -9 -f "$serve_pat"; pkill -9 -f "VLLM::"; sleep 2; }
SECONDS=0
OUT=$res/ours KEEP_SERVER=1 SERVE_ARGS="--additional-config $ours_cfg" \
  ABLATION_ARGS="--modes $modes --strategy search --start-rate ${OURS_START:-32} $search" \
  timeout -k 5 "${OURS_T:-330}" bash scripts/gpu_serve_smoke.sh > "$res/ours.txt" 2>&1
echo "ours ended at ${SECONDS} s" >> "$res/times.txt"
stop_all
OUT=$res/stock PORT=8001 KEEP_SERVER=1 \
  SERVE_ARGS="--scheduler-cls vllm.v1.core.sched.async_scheduler.AsyncScheduler --additional-config $cfg" \
  SEARCH_ARGS="--seeds 0 --start-rate ${STOCK_START:-16} $search" \
  timeout -k 5 "${STOCK_T:-200}" bash scripts/gpu_serve_smoke.sh > "$res/stock.txt" 2>&1
echo "stock ended at ${SECONDS} s" >> "$res/times.txt"
stop_all
for f in "$res"/*/serve.log; do grep -v '"POST /v1/audio/speech HTTP/1.1" 200 OK' "$f" > "$f.short"; mv "$f.short" "$f"; done
cat "$res/times.txt"; grep -h "code predictor:\|init engine\|step host time" "$res"/*/serve.log | cut -c1-220
tar czf "$final_out/results.tgz" -C "$res" .
