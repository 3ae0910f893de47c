#!/usr/bin/env bash
# One device session on two H200s (`nvidia-h200-x2`), after the three install calls (README, GPU section):
#   source scripts/gpu_env.sh .gpu && bash scripts/gpu_session.sh start     # launches both jobs, returns at once
#   source scripts/gpu_env.sh .gpu && bash scripts/gpu_session.sh collect   # waits (<= 570 s), snapshots into $OUT
# Call `collect` again within the host's 30 s warm window until it prints "all done".
# GPU 0 (cores 0-15): the issue-7 ablation on one server (scripts/gpu_issue7.sh; modes, seeds and budgets from the
#   environment). GPU 1 (cores 16-31): the microbenchmarks and Figure 3 (scripts/gpu_microbench.sh), then a second
#   server with VARIANT_CONFIG (default: the LM partition on) and a lanes-only capacity search with seed 0.
# Each job runs in its own process session (setsid), so it outlives the call that started it while the host is warm.
set -uo pipefail
root=${SESSION_DIR:-/tmp/session}
case "${1:?start|collect}" in
start)
  mkdir -p "$root/gpu0" "$root/gpu1"
  pin0=(taskset -c 0-15) pin1=(taskset -c 16-31)
  command -v taskset > /dev/null && [ "$(nproc)" -ge 32 ] || { pin0=(); pin1=(); echo "cores not pinned"; }
  export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-8}  # compiles on one GPU's cores only
  CUDA_VISIBLE_DEVICES=0 OUT=$root/gpu0 RES=$root/gpu0/run OURS_T=${OURS_T:-1300} SEEDS=${SEEDS:-0,1,2} \
    BUDGET_S=${BUDGET_S:-420} setsid "${pin0[@]}" bash -c \
    'bash scripts/gpu_issue7.sh > "$OUT/job.txt" 2>&1; touch "$OUT/done"' > /dev/null 2>&1 &
  variant=${VARIANT_CONFIG:-'{"voxserve":{"codec_dtype":"bfloat16","first_chunk_frames":5,"lanes":{"lm_partition":true},"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
  CUDA_VISIBLE_DEVICES=1 OUT=$root/gpu1 RES=$root/gpu1/micro PARTS=${PARTS:-tests,cp,codec,fig3} \
    VOXSERVE_CONFIG=$variant setsid "${pin1[@]}" bash -c '
      bash scripts/gpu_microbench.sh > "$OUT/micro.txt" 2>&1
      while [ ! -e /tmp/qwen3-tts-1.7b-customvoice-random/vocab.json ]; do sleep 5; done  # GPU 0 makes it
      sleep 20
      OUT=$OUT/variant RES=$OUT/run PORT=8001 MODES=lanes SEEDS=0 START_RATE=${VARIANT_START:-32} \
        BUDGET_S=${VARIANT_BUDGET_S:-200} OURS_T=${VARIANT_T:-420} bash scripts/gpu_issue7.sh > "$OUT/variant.txt" 2>&1
      touch "$OUT/done"' > /dev/null 2>&1 &
  mkdir -p "$root/gpu1/variant"
  sleep 5; echo "started"; nvidia-smi --query-gpu=index,memory.used --format=csv
  ;;
collect)
  for _ in $(seq "${WAIT_S:-570}"); do
    [ -e "$root/gpu0/done" ] && [ -e "$root/gpu1/done" ] && break
    sleep 1
  done
  for g in gpu0 gpu1; do [ -e "$root/$g/done" ] && echo "$g done" || echo "$g running"; done
  [ -e "$root/gpu0/done" ] && [ -e "$root/gpu1/done" ] && echo "all done"
  tail -n 4 "$root"/gpu0/run/run.txt "$root"/gpu1/micro/times.txt "$root"/gpu1/variant/run/run.txt 2>/dev/null
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
  tar czf "$OUT/snapshot.tgz" --exclude='*.safetensors' -C "$root" .
  ;;
esac
