#!/usr/bin/env bash
# The whole measurement protocol of one day in one command, for a GPU host where a command may run for hours
# (`source benchmarks/gpu_host/env.sh .gpu` first; about 25 minutes a start on an H100 from 56 req/s):
#   1. our defaults on STARTS (2) fresh server starts, one after the other: each the whole sweep from START_RATE to
#      two rates past its first miss, then the overload stage at 1.5 and 2 times that start's capacity at 99 %;
#   2. vLLM's stock scheduler on a fresh start of its own, its whole sweep from STOCK_START_RATE;
#   3. every record slimmed beside its start (with the host's speed at the start and after the sweep, host.json and
#      host_after_sweep.json) and the report of all of them against stock, with what every start of
#      ours held (`benchmarks.protocol_report --starts`; plots where matplotlib is installed, otherwise rerun the
#      printed command elsewhere for them).
#   OUT              where each start's folder (start1, start2, ..., stock) and the report go (required)
#   START_RATE       our sweeps' first rate, about half the expected capacity (required)
#   STOCK_START_RATE stock's first rate (default: 2/5 of START_RATE to the nearest rate step, at least one step: stock
#                    has served 2.2-3 times less, so about half its capacity again)
#   STARTS           how many starts of our defaults (default 2)
#   PROTOCOL         the one-start script (default: protocol.sh beside this one); its other settings (PORT, WORK,
#                    WINDOW_S, RATE_STEP, SWEEP_ARGS, ...) pass through: SWEEP_ARGS="--max-words 12" measures the
#                    short-utterance workload (LibriTTS texts of at most 12 words) the same way
#   PYTHON           the interpreter for the records and the report (default python3)
# Each start ends with the server stopped; a start whose server does not come up stops the day there.
set -uo pipefail
out=${OUT:?set OUT}; start_rate=${START_RATE:?set START_RATE}; starts=${STARTS:-2}; step=${RATE_STEP:-8}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); protocol=${PROTOCOL:-$here/protocol.sh}
stock_rate=${STOCK_START_RATE:-$(( (start_rate * 2 / 5 + step / 2) / step * step ))}
[ "$stock_rate" -ge "$step" ] || stock_rate=$step
mkdir -p "$out"

one_start() {  # folder, label, mode, first rate, stages
  mkdir -p "$out/$1"
  echo "== $1: $5 ($3 from $4 req/s, $(date -u +%FT%TZ))"
  # CALL_S: no command limit here, so each wait lasts until its sweep ends
  OUT=$out/$1 LABEL=$2 MODE=$3 START_RATE=$4 STAGES=$5 CALL_S=${DAY_CALL_S:-86400} CALL_STARTED=$(date +%s) \
    bash "$protocol"
}

place_hosts() {  # folder, label: the host's speeds (at the start, after the sweep) where the report reads them
  [ -e "$out/$1/host_$2.json" ] && mv "$out/$1/host_$2.json" "$out/$1/host.json"
  [ -e "$out/$1/host_after_sweep_$2.json" ] && mv "$out/$1/host_after_sweep_$2.json" "$out/$1/host_after_sweep.json"
  return 0
}

stop() {  # the running server, whatever the stages before it did: the next start must not find it
  OUT=$out STAGES=stop bash "$protocol" || { echo "protocol_day.sh: the server did not stop" >&2; exit 1; }
}

inputs=(); labels=()
for i in $(seq 1 "$starts"); do
  one_start "start$i" "start$i" voxserve "$start_rate" "serve sweep wait" || { stop; exit 1; }
  # no rate held 99 %: no overload rates, and the report says so
  one_start "start$i" "start$i" voxserve "$start_rate" "overload wait" || echo "start$i: no overload stage"
  stop; place_hosts "start$i" "start$i"
  input=$out/start$i/sweep; [ -e "$out/start$i/record_overload_start$i.json.xz" ] && input+="+$out/start$i/overload"
  inputs+=("$input"); labels+=("start$i")
done
one_start stock stock vllm-stock "$stock_rate" "serve sweep wait" || { stop; exit 1; }
stop; place_hosts stock stock
inputs+=("$out/stock/sweep"); labels+=(vllm-stock)

for folder in $(seq -f "start%g" 1 "$starts") stock; do  # each start's label is its folder's name
  for name in sweep overload; do
    record=$out/$folder/record_${name}_$folder.json.xz
    [ -e "$record" ] && "$python" -m benchmarks.record --slim "$record" "$out/$folder/$name"
  done
done
report=("$python" -m benchmarks.protocol_report "${inputs[@]}" --labels "${labels[@]}" --baseline vllm-stock
        --starts "${labels[@]:0:starts}" --out "$out/report")
echo "${report[*]}"
"${report[@]}"
