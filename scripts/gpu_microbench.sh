#!/usr/bin/env bash
# On the GPU machine, one call (about 6 minutes, torch only; no vLLM needed): the GPU tests, the code-predictor frame
# (reference vs fused vs compiled), the codec executable (graph vs compiled graph, whole GPU and a codec partition),
# and the Figure 3 measurements with the real-shaped backbone. Results: $OUT/microbench.tgz (plot Figure 3 later with
# `python -m benchmarks.fig3.plot fig3.json` where matplotlib is installed).
set -uo pipefail
final_out=${OUT:?set OUT}
res=${RES:-/tmp/microbench}; mkdir -p "$res"
SECONDS=0
timeout -k 5 "${TESTS_T:-150}" python3 -m pytest -q -m gpu tests/codec_lanes tests/models tests/worker > "$res/gpu_tests.txt" 2>&1
echo "tests ended at ${SECONDS} s" >> "$res/times.txt"
timeout -k 5 "${CP_T:-120}" python3 -m benchmarks.code_predictor_step --out "$res/code_predictor_step.json" \
  > "$res/code_predictor_step.txt" 2>&1
echo "code predictor ended at ${SECONDS} s" >> "$res/times.txt"
timeout -k 5 "${CODEC_T:-150}" python3 -m benchmarks.codec_step --codec-sms "${CODEC_SMS:-32}" \
  --out "$res/codec_step.json" > "$res/codec_step.txt" 2>&1
echo "codec ended at ${SECONDS} s" >> "$res/times.txt"
timeout -k 5 "${FIG3_T:-150}" python3 -m benchmarks.fig3.measure --out "$res/fig3.json" > "$res/fig3.txt" 2>&1
echo "fig3 ended at ${SECONDS} s" >> "$res/times.txt"
tail -3 "$res"/*.txt
tar czf "$final_out/microbench.tgz" -C "$res" .
