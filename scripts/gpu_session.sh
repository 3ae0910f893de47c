#!/usr/bin/env bash
# One device session on two H200s (`nvidia-h200-x2`), after the install calls (README, GPU section: piece folders):
#   source scripts/gpu_env.sh .gpu && bash scripts/gpu_session.sh start     # launches both jobs, returns at once
#   source scripts/gpu_env.sh .gpu && bash scripts/gpu_session.sh collect   # waits (<= 570 s), snapshots into $OUT
# Call `collect` again within the host's 30 s warm window until it prints "all done".
# GPU 0 (cores 0-15): the microbenchmarks named in GPU0_PARTS_BEFORE, then the issue-7 ablation on one server
#   (scripts/gpu_issue7.sh) with CONFIG (GPU0_SPLIT_FROM_FIG3=1: with the codec SMs the `fig3` part of
#   GPU0_PARTS_BEFORE chose); modes, seeds and budgets from GPU0_MODES (empty: no server), SEEDS,
#   GPU0_BUDGET_S, START_RATE; then the microbenchmarks named in GPU0_PARTS. On one GPU (`nvidia-h200`) set
#   GPU1_PARTS=none GPU1_MODES= . GPU0_SERVE_ARGS: more `vllm serve` arguments for that server. GPU0_FIRST_MODES:
#   before it, a first server with GPU0_FIRST_SERVE_ARGS (and GPU0_FIRST_CONFIG, default CONFIG) and a capacity
#   search of these modes from GPU0_FIRST_START (GPU0_FIRST_BUDGET_S, GPU0_FIRST_T), results under gpu0/first. GPU 1 (cores 16-31): the microbenchmarks named in GPU1_PARTS ("none": skip)
#   (scripts/gpu_microbench.sh), then, unless GPU1_MODES is empty, a second server (GPU1_CONFIG, default CONFIG) and a
#   capacity search of GPU1_MODES with GPU1_SEEDS (or, with GPU1_PROFILE_RATE, scripts/gpu_profile_step.sh at that
#   rate), then the microbenchmarks named in GPU1_PARTS_AFTER; GPU1_SERVE_ARGS: more `vllm serve` arguments there. Two servers at once: same commit, settings and GPU
#   model.
# Each job runs in its own process session (setsid), so it outlives the call that started it while the host is warm.
set -uo pipefail
root=${SESSION_DIR:-/tmp/session}
case "${1:?start|collect}" in
start)
  mkdir -p "$root/gpu0" "$root/gpu1/variant"
  pin0=(taskset -c 0-15) pin1=(taskset -c 16-31)
  command -v taskset > /dev/null && [ "$(nproc)" -ge 32 ] || { pin0=(); pin1=(); echo "cores not pinned"; }
  export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-16}  # each job has 16 cores of its own
  config=${CONFIG:-'{"voxserve":{"admin_routes":true,"codec_dtype":"bfloat16","first_chunk_frames":5,"scheduler":{"max_decode_batch":128,"overload_mode":"off"}}}'}
  CUDA_VISIBLE_DEVICES=0 OUT=$root/gpu0 RES=$root/gpu0/run OURS_T=${GPU0_T:-1300} SEEDS=${SEEDS:-0,1,2} \
    MODES=${GPU0_MODES-vllm-stock,inline,lanes} BUDGET_S=${GPU0_BUDGET_S:-420} VOXSERVE_CONFIG=$config \
    GPU0_PARTS=${GPU0_PARTS:-} GPU0_PARTS_BEFORE=${GPU0_PARTS_BEFORE:-} \
    GPU0_SPLIT_FROM_FIG3=${GPU0_SPLIT_FROM_FIG3:-} GPU0_FIRST_MODES=${GPU0_FIRST_MODES:-} \
    GPU0_FIRST_SERVE_ARGS=${GPU0_FIRST_SERVE_ARGS:-} GPU0_FIRST_BUDGET_S=${GPU0_FIRST_BUDGET_S:-200} \
    GPU0_FIRST_T=${GPU0_FIRST_T:-600} GPU0_FIRST_CONFIG=${GPU0_FIRST_CONFIG:-} GPU0_FIRST_START=${GPU0_FIRST_START:-} \
    GPU0_SERVE_ARGS=${GPU0_SERVE_ARGS:-} \
    setsid "${pin0[@]}" bash -c '
      [ -z "$GPU0_PARTS_BEFORE" ] || RES=$OUT/micro_before PARTS=$GPU0_PARTS_BEFORE bash scripts/gpu_microbench.sh \
        > "$OUT/micro_before.txt" 2>&1
      if [ -n "$GPU0_SPLIT_FROM_FIG3" ]; then  # the codec SMs that the fig3 part of GPU0_PARTS_BEFORE chose
        VOXSERVE_CONFIG=$(python3 -m benchmarks.split_chooser --split-from "$OUT/micro_before/fig3.json" \
          "$VOXSERVE_CONFIG" 2>> "$OUT/codec_choice.txt")
      fi
      if [ -n "$GPU0_FIRST_MODES" ]; then  # a first server with other `vllm serve` arguments, its own results
        mkdir -p "$OUT/first"
        RES=$OUT/first/run OUT=$OUT/first MODES=$GPU0_FIRST_MODES EXTRA_SERVE_ARGS=$GPU0_FIRST_SERVE_ARGS \
          VOXSERVE_CONFIG=${GPU0_FIRST_CONFIG:-$VOXSERVE_CONFIG} START_RATE=${GPU0_FIRST_START:-$START_RATE} \
          BUDGET_S=$GPU0_FIRST_BUDGET_S OURS_T=$GPU0_FIRST_T bash scripts/gpu_issue7.sh > "$OUT/first.txt" 2>&1
      fi
      [ -z "$MODES" ] || EXTRA_SERVE_ARGS=$GPU0_SERVE_ARGS bash scripts/gpu_issue7.sh > "$OUT/job.txt" 2>&1
      [ -z "$GPU0_PARTS" ] || OUT=$OUT RES=$OUT/micro PARTS=$GPU0_PARTS bash scripts/gpu_microbench.sh > "$OUT/micro.txt" 2>&1
      touch "$OUT/done"' > /dev/null 2>&1 &
  # GPU 1: microbenchmarks, then (GPU1_MODES not empty) a second server with GPU1_CONFIG (default: the same config)
  CUDA_VISIBLE_DEVICES=1 OUT=$root/gpu1 RES=$root/gpu1/micro PARTS=${GPU1_PARTS:-tests,cp,codec,fig3} \
    VOXSERVE_CONFIG=${GPU1_CONFIG:-$config} GPU1_MODES=${GPU1_MODES-lanes} SEEDS=${GPU1_SEEDS:-0} \
    START_RATE=${GPU1_START:-16} BUDGET_S=${GPU1_BUDGET_S:-200} OURS_T=${GPU1_T:-420} \
    GPU1_PROFILE_RATE=${GPU1_PROFILE_RATE:-} GPU0_MAKES_CKPT=${GPU0_MODES-x} GPU1_PARTS_AFTER=${GPU1_PARTS_AFTER:-} \
    GPU1_SERVE_ARGS=${GPU1_SERVE_ARGS:-} \
    CKPT=${CKPT:-/tmp/qwen3-tts-1.7b-customvoice-random} CKPT_SETTLE_S=${CKPT_SETTLE_S:-20} setsid "${pin1[@]}" bash -c '
      [ "$PARTS" = none ] || bash scripts/gpu_microbench.sh > "$OUT/micro.txt" 2>&1
      if [ -n "$GPU1_PROFILE_RATE" ]; then  # profile served steps under load instead of a second capacity search
        if [ -n "$GPU0_MAKES_CKPT" ]; then  # GPU 0 makes the checkpoint; else the profile script does
          while [ ! -e "$CKPT/vocab.json" ]; do sleep 5; done
          sleep "$CKPT_SETTLE_S"
        fi
        OUT=$OUT/variant RES=$OUT/run PORT=8001 RATE=$GPU1_PROFILE_RATE bash scripts/gpu_profile_step.sh \
          > "$OUT/variant.txt" 2>&1
      elif [ -n "$GPU1_MODES" ]; then
        while [ ! -e "$CKPT/vocab.json" ]; do sleep 5; done  # GPU 0 makes it
        sleep "$CKPT_SETTLE_S"
        OUT=$OUT/variant RES=$OUT/run PORT=8001 MODES=$GPU1_MODES EXTRA_SERVE_ARGS=$GPU1_SERVE_ARGS bash scripts/gpu_issue7.sh \
          > "$OUT/variant.txt" 2>&1
      fi
      [ -z "$GPU1_PARTS_AFTER" ] || RES=$OUT/micro_after PARTS=$GPU1_PARTS_AFTER bash scripts/gpu_microbench.sh \
        > "$OUT/micro_after.txt" 2>&1
      touch "$OUT/done"' > /dev/null 2>&1 &
  sleep 5; echo "started"; nvidia-smi --query-gpu=index,memory.used --format=csv
  ;;
collect)
  for _ in $(seq "${WAIT_S:-570}"); do
    [ -e "$root/gpu0/done" ] && [ -e "$root/gpu1/done" ] && break
    sleep 1
  done
  for g in gpu0 gpu1; do [ -e "$root/$g/done" ] && echo "$g done" || echo "$g running"; done
  [ -e "$root/gpu0/done" ] && [ -e "$root/gpu1/done" ] && echo "all done"
  tail -n 4 "$root"/gpu0/first/run/run.txt "$root"/gpu0/run/run.txt "$root"/gpu*/micro*/times.txt "$root"/gpu1/variant/run/run.txt 2>/dev/null
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
  # Each benchmark record travels xz-compressed (a four-mode run's raw record.json made the snapshot too large for
  # the device tool to return, session 15): record.json.xz beside it, the raw file left out.
  find "$root" -name record.json -print0 | while IFS= read -r -d '' record; do
    if command -v xz > /dev/null; then xz -T0 -6 -k -f "$record"
    else python3 -c 'import lzma, sys; from pathlib import Path; p = Path(sys.argv[1])
Path(f"{p}.xz").write_bytes(lzma.compress(p.read_bytes()))' "$record"; fi
  done
  tar czf "$OUT/snapshot.tgz" --exclude='*.safetensors' --exclude=record.json -C "$root" .
  # the servers' compile results, for the next session's machine (carry it as .gpu/compile_cache.bin), where the
  # device tool can return it (16 MiB a file; session 11's, 56 MB, was left out)
  if [ -n "${VOXSERVE_COMPILE_CACHE:-}" ] && [ -e "$VOXSERVE_COMPILE_CACHE" ]; then
    size=$(stat -c %s "$VOXSERVE_COMPILE_CACHE")
    if [ "$size" -le $(( 16 * 1024 * 1024 )) ]; then cp "$VOXSERVE_COMPILE_CACHE" "$OUT/"
    else echo "compile cache not returned: $size bytes"; fi
  fi
  ;;
esac
