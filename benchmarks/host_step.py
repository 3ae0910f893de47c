"""Host time of one step's input preparation (`StepBuffers.fill`) for N decode rows, on this machine's CPU.

    python -m benchmarks.host_step --rows 128

The part of the gap between backbone steps that the speech side's step layout costs (the served worker also logs
its whole share, `voxserve step host time`, every 2,000 steps). Buffers live on the CPU here, so host-to-device
copies cost less than on a GPU host."""

from __future__ import annotations

import argparse
import time

import torch

from vllm_voxserve.models.qwen3_tts.step_buffers import ServedRequest, StepBuffers
from vllm_voxserve.worker.step_layout import StepLayout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    hidden, prompt_len = 2048, 30
    buffers = StepBuffers(8192, args.rows, hidden, torch.bfloat16, "cpu")
    requests = {f"r{i}": ServedRequest(f"r{i}", i, prompt_len, torch.zeros(prompt_len, hidden, dtype=torch.bfloat16),
                                       tuple(range(40)), 1, True, 0.9, 50, 1.0, i) for i in range(args.rows)}
    layout = StepLayout(tuple(requests), (1,) * args.rows, tuple(prompt_len + 5 + i % 7 for i in range(args.rows)))
    for _ in range(20):
        buffers.fill(layout, requests)
    started = time.perf_counter()
    for _ in range(args.repeats):
        buffers.fill(layout, requests)
    print(f"StepBuffers.fill, {args.rows} decode rows: {(time.perf_counter() - started) / args.repeats * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
