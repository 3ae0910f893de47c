#!/usr/bin/env bash
# On the GPU machine (torch only; no vLLM needed): the parts named in PARTS (default "tests,cp,codec", about 10 min;
# "fig3" alone takes about 3 min): the GPU tests, the code-predictor frame (reference vs fused vs compiled), the
# codec executable in its served conv forms (uncompiled, with its convolutions listed, and compiled; on the whole GPU
# and a 48-SM codec partition),
# "snake" (one SnakeBeta pass with static and dynamic sizes: benchmarks/snake_pass.py), "tiles" (the TMA conv kernel's
# tiles: benchmarks/codec_conv_tiles.py),
# "codec_old" (the same from an older tree, OLD_TREE), the Figure 3 measurements with the real-shaped backbone, and
# "priority" (that backbone on the whole GPU at each stream priority beside the codec lane: benchmarks/backbone_priority.py).
# Results: $OUT/microbench.tgz (plot Figure 3 later with `python -m benchmarks.fig3.plot fig3.json` where matplotlib
# is).
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/microbench}; mkdir -p "$res"
parts=",${PARTS:-tests,cp,codec},"
SECONDS=0
if [[ $parts == *,tests,* ]]; then
  # TESTS: the test paths (default: every GPU test)
  timeout -k 5 "${TESTS_T:-420}" python3 -m pytest -q -m gpu ${TESTS:-tests/codec_lanes tests/models tests/worker} \
    > "$res/gpu_tests.txt" 2>&1
  echo "tests ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,cp,* ]]; then
  timeout -k 5 "${CP_T:-100}" python3 -m benchmarks.code_predictor_step ${CP_ARGS:-} --out "$res/code_predictor_step.json" \
    > "$res/code_predictor_step.txt" 2>&1
  echo "code predictor ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,tiles,* ]]; then  # the TMA conv kernel's tiles for the k7 convs (about 2 min); the codec part
  # below then times the codec with them: put them in tma_conv.TILES before serving them.
  timeout -k 5 "${TILES_T:-240}" python3 -m benchmarks.codec_conv_tiles --shapes "${TILES_SHAPES:-64x10,4x5}" \
    --out "$res/tiles.json" > "$res/tiles.txt" 2>&1
  echo "tiles ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,snake,* ]]; then  # one SnakeBeta pass with static and dynamic sizes, beside a copy (about 30 s)
  timeout -k 5 "${SNAKE_T:-120}" python3 -m benchmarks.snake_pass --out "$res/snake_pass.json" > "$res/snake_pass.txt" 2>&1
  echo "snake ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,codec,* ]]; then  # each compiled shape class costs a compile (30-55 s): six here
  # CODEC_KEEP_CODE=1: keep inductor's generated sources of the compiled forms (codec_inductor_code.tgz), to read
  # the kernels a profile names
  [ -z "${CODEC_KEEP_CODE:-}" ] || export TORCHINDUCTOR_CACHE_DIR=$res/inductor_cache
  tiles=(); [ -f "$res/tiles.json" ] && tiles=(--conv-tiles "$res/tiles.json")
  timeout -k 5 "${CODEC_T:-480}" python3 -m benchmarks.codec_step --profile-batch "${CODEC_PROFILE:-16}" ${tiles[@]+"${tiles[@]}"} \
    --variants "${CODEC_VARIANTS:-graph,graph+compile}" \
    --batches "${CODEC_BATCHES:-1,4,16}" --frames "${CODEC_FRAMES:-5,10}" --codec-sms "${CODEC_SMS:-48}" --out "$res/codec_step.json" > "$res/codec_step.txt" 2>&1
  echo "codec ended at ${SECONDS} s" >> "$res/times.txt"
  if [ -n "${CODEC_KEEP_CODE:-}" ]; then
    (cd "$res/inductor_cache" && find . -name "*.py" -print0 | tar czf "$res/codec_inductor_code.tgz" --null -T -)
    rm -rf "$res/inductor_cache"
    unset TORCHINDUCTOR_CACHE_DIR
  fi
fi
if [[ $parts == *,codec_old,* ]]; then  # the same codec measured by an older tree (OLD_TREE: `git archive REV
  # vllm_voxserve benchmarks | tar -x -C DIR`, carried), side by side with this one's
  (cd "${OLD_TREE:?set OLD_TREE}" && PYTHONPATH=. timeout -k 5 "${CODEC_T:-300}" python3 -m benchmarks.codec_step \
    --batches 1,16 --frames 10 --codec-sms "${CODEC_SMS:-48}" --out "$res/codec_step_old.json") \
    > "$res/codec_step_old.txt" 2>&1
  echo "codec_old ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,fig3,* ]]; then
  timeout -k 5 "${FIG3_T:-300}" python3 -X faulthandler -m benchmarks.fig3.measure ${FIG3_ARGS:-} --out "$res/fig3.json" > "$res/fig3.txt" 2>&1 \
    || timeout -k 5 "${FIG3_T:-300}" python3 -X faulthandler -m benchmarks.fig3.measure ${FIG3_ARGS:-} --skip-alone \
      --out "$res/fig3_skip_alone.json" > "$res/fig3_skip_alone.txt" 2>&1  # a crash: again without stage (a)
  echo "fig3 ended at ${SECONDS} s" >> "$res/times.txt"
fi
if [[ $parts == *,priority,* ]]; then  # the backbone step beside the codec lane at each stream priority (about 2 min)
  timeout -k 5 "${PRIORITY_T:-330}" python3 -m benchmarks.backbone_priority ${PRIORITY_ARGS:-} \
    --out "$res/priority.json" > "$res/priority.txt" 2>&1
  echo "priority ended at ${SECONDS} s" >> "$res/times.txt"
fi
tail -n 3 "$res"/*.txt
tar czf "$final_out/microbench.tgz" -C "$res" .
