#!/usr/bin/env bash
# On the GPU host (stack installed, `source benchmarks/gpu_host/env.sh .gpu`), against one server at the defaults a user
# gets (no flags but the admin routes), the stages named in STAGES (default "serve checks"):
#   serve   start it (kept running for later calls) and stream a few requests
#   checks  codec mode switches, each answered 200 or refused with a 4xx/503, never 500, and a request streaming
#           after them; seeded sampled requests alone and among 8 (benchmarks.seed_invariance)
#   sweep   an open-loop sweep at RATES (LibriTTS, one seed a rate, WINDOW_S windows) and the step log
# Results under $OUT (results.tgz with the logs).
set -uo pipefail
out=${OUT:?set OUT}; port=${PORT:-8000}; url=http://127.0.0.1:$port; work=${WORK:-/tmp/serve_checks}
mkdir -p "$work/serve"
call() { curl -s -w ' HTTP %{http_code}\n' "$@"; }
for stage in ${STAGES:-serve checks}; do
  case $stage in
  serve)
    OUT=$work/serve KEEP_SERVER=1 SERVE_ARGS="--additional-config {\"voxserve\":{\"admin_routes\":true}}" \
      PROBE_ARGS="--concurrency 1 16" bash benchmarks/gpu_host/serve_smoke.sh > "$work/smoke.txt" 2>&1 \
      || { tail -40 "$work/smoke.txt"; tail -60 "$work/serve/serve.log"; }
    cat "$work/serve/startup.txt"; grep -h "serving defaults" "$work/serve/serve.log" | cut -c1-400 ;;
  checks)
    {
      echo "modes:"; call "$url/voxserve/modes"
      for mode in vllm-stock inline lanes; do
        echo "switch to $mode:"; call -X POST -H 'Content-Type: application/json' -d "{\"mode\":\"$mode\"}" "$url/voxserve/mode"
        call "$url/voxserve/modes"
      done
      echo "health:"; call "$url/health"
    } > "$work/mode_switch.txt" 2>&1
    cat "$work/mode_switch.txt"
    python3 benchmarks/gpu_host/stream_probe.py --url "$url" --model qwen3-tts --out "$work/probe_after_switch.json" \
      --concurrency 1 > "$work/probe_after_switch.txt" 2>&1; tail -3 "$work/probe_after_switch.txt"
    python3 -m benchmarks.seed_invariance --base-url "$url" --model qwen3-tts --probes "${SEED_PROBES:-12}" \
      --out "$work/seed_invariance.json" ;;
  sweep)
    timeout "${SWEEP_T:-480}" python3 -m benchmarks sweep --base-url "$url" --model qwen3-tts --fixed-length \
      --no-progress --rates "${RATES:?set RATES}" --seeds 0 --window-s "${WINDOW_S:-30}" --stop-fraction 0 \
      --out "$work/sweep" > "$work/sweep.txt" 2>&1
    tail -30 "$work/sweep.txt" ;;
  esac
done
grep -v '"POST /v1/audio/speech HTTP/1.1" 200 OK' "$work/serve/serve.log" > "$work/serve.log"
python3 -m benchmarks.step_log "$work/serve.log" > "$work/step_log.txt" 2>&1
tar cJf "$out/results.tar.xz" -C "$work" --exclude=serve/serve.log .
