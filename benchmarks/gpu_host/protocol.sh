#!/usr/bin/env bash
# On the GPU host (stack installed, `source benchmarks/gpu_host/env.sh .gpu`): the capacity measurement protocol for
# one server start. Each stage returns well inside a limited command time; the server and the sweep outlive the
# script, so a later command on the same host picks them up.
#   MODE     voxserve (default: the defaults a user gets) or vllm-stock (vLLM's own scheduler: the server starts
#            with the codec inline and is switched to it right after the start, before any load)
#   LABEL    names this start's files (default MODE)
#   SERVER_LABEL  the LABEL of the `serve` that started the running server, when this call's LABEL differs (after
#            `mode`): its log is read (default LABEL)
#   DP       serve with vLLM's --data-parallel-size DP (one engine core per GPU behind one API server; default: one)
#   CONFIG   further members of --additional-config, for a measurement away from the defaults (JSON without
#            spaces, e.g. CONFIG='"voxserve_internal":{"scheduler":{"background_min_batch":32}}'; default: none, the
#            defaults a user gets)
#   SETTINGS further members of its "voxserve" object, the settings a user may set, the same way (e.g.
#            SETTINGS='"lanes":{"split":{"group_sms":72}}'; default: none)
#   STAGES   default "serve sweep wait":
#     serve    measure the idle host's speed (benchmarks/host_speed.py), start a server with no flag but the admin
#              routes (the mode switch needs them), wait until healthy; the compile cache it used or wrote goes to
#              $OUT xz-compressed, for the next host (see README)
#     sweep    start the open-loop sweep in the background: LibriTTS at 5.2 frames a word, seeds 0,1,2 of WINDOW_S
#              (30) seconds per rate, rates from START_RATE in steps of RATE_STEP (8) req/s until BEYOND (2) rates
#              past the first whose attainment is below FAILURE (0.99); SWEEP_ARGS adds options (--max-words 12)
#     overload start a sweep at RATES (one seed) in the background: goodput past capacity; run it after the sweep, as
#              the in-progress limit it lowers takes seconds to grow back (2026-12-04_904736d). Without RATES: 1.5 and
#              2 times the finished sweep's capacity at 99 % (its record under WORK), the rates the report reads
#     wait     wait for the background sweep until CALL_S (560) seconds after CALL_STARTED (`date +%s` at the start
#              of the limited command, where several runs of this script share one; default: this script's start),
#              then copy its record, its log and the step log (a sweep three rates in still had its record cut 15 s
#              after CALL_S: keep CALL_S 40 s or more under the command's time limit); once the sweep has ended, the
#              idle host's speed again (host_after_sweep_LABEL.json)
#     profile  py-spy the engine core's and the API server's Python stacks for PROFILE_S (10) seconds in the middle of
#              a load at RATE req/s (one seed, WINDOW_S, SWEEP_ARGS): where the host time of a step goes (py-spy
#              among the carried wheels, see README)
#     concurrency  closed loop at LEVELS (1,4,8,16,32) requests in flight, PER_LEVEL (32) requests each (one seed), in
#              the foreground: TTFA at fixed concurrency, the table other servers publish
#     text     the whole-text workload and the same texts sent word by word over the WebSocket (TEXT_WORDS_PER_S,
#              30) at each of RATES, one after the other on this server (one seed of WINDOW_S each), in the foreground
#     mode     switch the running server to MODE (after a finished sweep: vLLM's stock scheduler measured on the
#              same start as ours when a second start does not fit; its first audio then follows ours' load). Needs
#              device memory for the inline codec beside the lanes: an H100 at the defaults has none (the switch is
#              refused and the script stops); there, start the server in the mode instead (MODE=vllm-stock serve)
#     stop     stop the server and wait until it is gone (STOP_S, 120 s, then killed)
# Results under $OUT: host_LABEL.json, host_after_sweep_LABEL.json, compile_cache.bin.xz, record_NAME.json.xz (every
# request and chunk), NAME.txt, step_log_LABEL.txt, serve_LABEL.log.xz (the server's log without its access lines:
# the step log's every gauge), stacks_LABEL.tar.xz (profile).
set -uo pipefail
out=${OUT:?set OUT}; port=${PORT:-8000}; url=http://127.0.0.1:$port; work=${WORK:-/tmp/protocol}
mode=${MODE:-voxserve}; label=${LABEL:-$mode}; server=${SERVER_LABEL:-$label}; dp_args=${DP:+ --data-parallel-size $DP}
mkdir -p "$work"; started=${CALL_STARTED:-$(date +%s)}

start_sweep() {  # name, arguments: the sweep under setsid, so that it survives the command that started it (unbuffered:
  # `wait` shows the rates finished so far)
  rm -rf "$work/$1" "$work/host_after_$1.json"  # a later start of the same label measures its own host
  setsid python3 -u -m benchmarks sweep --base-url "$url" --model qwen3-tts --fixed-length --no-progress \
    --stop-fraction 0 --out "$work/$1" "${@:2}" > "$work/$1.txt" 2>&1 &
  echo $! > "$work/$1.pid"
}

overload_rates() {  # 1.5 and 2 times the 99 % capacity in a finished sweep's record, comma-separated
  python3 - "$1" <<'PY'
import json, sys
try:
    capacity = json.load(open(sys.argv[1]))["capacity"]["0.99"]
except (OSError, ValueError, KeyError) as error:
    sys.exit(f"overload: no finished sweep's capacity in {sys.argv[1]} ({error!r}): set RATES")
if capacity <= 0:
    sys.exit("overload: the sweep held no rate at 99 %: set RATES")
print(",".join(f"{m * capacity:g}" for m in (1.5, 2)))
PY
}

switch_mode() {  # the running server to MODE (voxserve: our default, `lanes`); a refused switch ends the script, so
  # that no sweep runs under the wrong mode's label
  local name=$mode answer; [ "$name" = voxserve ] && name=lanes
  answer=$(curl -s -w ' HTTP %{http_code}' -X POST -H 'Content-Type: application/json' -d "{\"mode\":\"$name\"}" \
    "$url/voxserve/mode")
  echo "$answer"
  [ "${answer##* HTTP }" = 200 ] || { echo "protocol.sh: the switch to $name was refused; nothing measured" >&2; exit 1; }
}

wait_sweep() {  # name: until it ends or WAIT_S passes; then what it has so far
  local pid; pid=$(cat "$work/$1.pid")
  local deadline=$(( started + ${CALL_S:-560} ))
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  if kill -0 "$pid" 2>/dev/null; then echo "$1: still running"; else
    echo "$1: ended"
    # the idle host's speed again once the sweep has ended: one machine measured 48,076 and then 24,970 passes/s
    # twelve minutes apart (2026-12-07_12270f1_short_utterances), so a start's two figures show whether it changed
    case $1 in sweep_*)
      [ -e "$work/host_after_$1.json" ] || python3 -m benchmarks.host_speed --json "$work/host_after_$1.json"
      cp "$work/host_after_$1.json" "$out/" 2> /dev/null ;;
    esac
  fi
  grep "req/s: attainment\|stopped\|all rates" "$work/$1.txt"
  cp "$work/$1.txt" "$out/"
  [ -e "$work/$1/record.json" ] && xz -T0 -6 -c "$work/$1/record.json" > "$out/record_$1.json.xz"
  grep -v '"POST /v1/audio/speech HTTP/1.1" 200 OK' "$work/serve_$server/serve.log" > "$work/serve_$server.log"
  python3 -m benchmarks.step_log "$work/serve_$server.log" > "$out/step_log_$label.txt" 2>&1
  xz -T0 -6 -c "$work/serve_$server.log" > "$out/serve_$server.log.xz"
}

profile() {  # the stacks of both server processes in the middle of a load at RATE
  local log=$work/serve_$server/serve.log spy stacks=$work/stacks_$label
  spy=$(command -v py-spy || echo /opt/vox-wheels/bin/py-spy)
  mkdir -p "$stacks"
  start_sweep "profile_$label" --seeds 0 --window-s "${WINDOW_S:-30}" --rates "${RATE:?}" --warmup 16 ${SWEEP_ARGS:-}
  sleep $(( ${WINDOW_S:-30} / 2 ))
  for who in EngineCore APIServer; do
    pid=$(grep -o "$who pid=[0-9]*" "$log" | head -1 | cut -d= -f2)
    timeout 60 "$spy" record --pid "$pid" --duration "${PROFILE_S:-10}" --rate 250 --format raw --nolineno \
      --threads --nonblocking --output "$stacks/$who.txt" > "$stacks/$who.log" 2>&1 &
  done
  wait
  for who in EngineCore APIServer; do
    python3 -m benchmarks.host_profile "$stacks/$who.txt" --top 40 > "$stacks/$who.summary.txt" 2>&1
    head -25 "$stacks/$who.summary.txt"
  done
  tar cJf "$out/stacks_$label.tar.xz" -C "$work" "stacks_$label"
}

for stage in ${STAGES:-serve sweep wait}; do
  case $stage in
  serve)
    python3 -m benchmarks.host_speed --json "$out/host_$label.json"  # on the idle host: its speed beside the figures
    # a mode with the codec inline starts with it, so the codec lanes are never built beside it: on an 80 GB GPU
    # switching a server that started with the lanes to the inline codec finds no device memory (2026-12-06_a0a5467)
    codec=""; case $mode in vllm-stock|inline*) codec=',"codec_mode":"inline"' ;; esac
    # one word: serve_smoke.sh splits SERVE_ARGS
    config="{\"voxserve\":{\"admin_routes\":true$codec${SETTINGS:+,$SETTINGS}}${CONFIG:+,$CONFIG}}"
    OUT=$work/serve_$server KEEP_SERVER=1 SERVE_ARGS="--additional-config $config$dp_args" \
      PROBE_ARGS="--concurrency 1" bash benchmarks/gpu_host/serve_smoke.sh > "$work/smoke_$label.txt" 2>&1 \
      || { tail -40 "$work/smoke_$label.txt"; tail -60 "$work/serve_$server/serve.log"; exit 1; }
    cat "$work/serve_$server/startup.txt"; grep -h "serving defaults" "$work/serve_$server/serve.log" | cut -c1-300
    cache=${VOXSERVE_COMPILE_CACHE:-}  # written before the server was healthy; xz makes 149 MB about 9 MB
    [ -f "$cache" ] && [ ! -e "$out/compile_cache.bin.xz" ] && xz -T0 -6 -c "$cache" > "$out/compile_cache.bin.xz"
    [ "$mode" != voxserve ] && switch_mode
    curl -s "$url/voxserve/modes"; echo ;;
  mode)
    switch_mode; curl -s "$url/voxserve/modes"; echo ;;
  sweep)
    start_sweep "sweep_$label" --seeds 0,1,2 --window-s "${WINDOW_S:-30}" --start-rate "${START_RATE:?}" \
      --rate-step "${RATE_STEP:-8}" --max-rate 400 --beyond-failure "${BEYOND:-2}" \
      --failure-threshold "${FAILURE:-0.99}" ${SWEEP_ARGS:-} ;;
  overload)
    pid_file=$work/sweep_$label.pid
    if [ -z "${RATES:-}" ] && [ -e "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2> /dev/null; then
      echo "overload: sweep_$label is still running: wait for it, or set RATES" >&2; exit 1
    fi
    rates=${RATES:-$(overload_rates "$work/sweep_$label/record.json")} || exit 1
    echo "overload rates: $rates req/s"
    start_sweep "overload_$label" --seeds 0 --window-s "${WINDOW_S:-30}" --rates "$rates" ${SWEEP_ARGS:-} ;;
  profile)
    profile ;;
  concurrency)
    name=concurrency_$label
    python3 -m benchmarks concurrency --base-url "$url" --model qwen3-tts --fixed-length --no-progress \
      --stop-fraction 0 --seeds 0 --levels "${LEVELS:-1,4,8,16,32}" --requests-per-level "${PER_LEVEL:-32}" \
      --warmup 16 --out "$work/$name" ${SWEEP_ARGS:-} > "$work/$name.txt" 2>&1
    grep "concurrent:" "$work/$name.txt"; cp "$work/$name.txt" "$out/"
    [ -e "$work/$name/record.json" ] && xz -T0 -6 -c "$work/$name/record.json" > "$out/record_$name.json.xz" ;;
  text)
    for rate in ${RATES//,/ }; do
      for kind in sweep text-stream; do
        name=${kind}_${rate}_$label
        extra=(); [ "$kind" = text-stream ] && extra=(--text-words-per-s "${TEXT_WORDS_PER_S:-30}")
        python3 -m benchmarks "$kind" --base-url "$url" --model qwen3-tts --fixed-length --no-progress \
          --stop-fraction 0 --seeds 0 --window-s "${WINDOW_S:-30}" --rates "$rate" --warmup 16 "${extra[@]}" \
          --out "$work/$name" ${SWEEP_ARGS:-} > "$work/$name.txt" 2>&1
        grep "req/s: attainment" "$work/$name.txt"; cp "$work/$name.txt" "$out/"
        [ -e "$work/$name/record.json" ] && xz -T0 -6 -c "$work/$name/record.json" > "$out/record_$name.json.xz"
      done
    done ;;
  wait)
    for name in sweep_$label overload_$label profile_$label; do [ -e "$work/$name.pid" ] && wait_sweep "$name"; done ;;
  stop)  # until the server's processes are gone: the next `serve` would reuse one still answering
    server_up() { pgrep -f "vllm.entrypoints.cli.main serve" > /dev/null || curl -sf "$url/health" > /dev/null; }
    pkill -f "vllm.entrypoints.cli.main serve" || true
    for _ in $(seq "${STOP_S:-120}"); do server_up || break; sleep 1; done
    if server_up; then
      pkill -9 -f "vllm.entrypoints.cli.main serve"; sleep 5
      curl -sf "$url/health" > /dev/null && { echo "protocol.sh: a server still answers on $url" >&2; exit 1; }
    fi ;;
  esac
done
