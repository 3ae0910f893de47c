"""Host time of the speech side's per-step work for N decode rows, on this machine's CPU.

    python -m benchmarks.host_step --rows 128 [--part fill|after_forward|both]

`fill`: one step's input preparation (`StepBuffers.fill`). `after_forward`: the worker's work after the forward
(`SpeechRuntime.after_forward`: frames to streams, chunks cut, the lanes mode's dispatch) with a codec that decodes
nothing, so only the bookkeeping is timed; N streams each get one frame a step and a new stream replaces each one
that ends.

The part of the gap between backbone steps that the speech side's step layout costs (the served worker also logs
its whole share, `voxserve step host time`, every 2,000 steps). Buffers live on the CPU here, so host-to-device
copies cost less than on a GPU host."""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.codecless_runtime import SteadyStreams, codecless_runtime
from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.qwen3_tts.step_buffers import ServedRequest, StepBuffers
from vllm_voxserve.models.step_layout import StepLayout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--part", choices=("fill", "after_forward", "both"), default="both")
    args = ap.parse_args()
    if args.part in ("fill", "both"):
        time_fill(args)
    if args.part in ("after_forward", "both"):
        time_after_forward(args)


def time_fill(args) -> None:
    hidden, prompt_len = 2048, 30
    buffers = StepBuffers(8192, args.rows, hidden, torch.bfloat16, "cpu", vocab_size=3072)
    requests = {f"r{i}": ServedRequest(f"r{i}", i, prompt_len, torch.zeros(prompt_len, hidden, dtype=torch.bfloat16),
                                       tuple(range(40)), 1, True, 0.9, 50, 1.0, i) for i in range(args.rows)}
    layout = StepLayout(tuple(requests), (1,) * args.rows, tuple(prompt_len + 5 + i % 7 for i in range(args.rows)))
    for _ in range(20):
        buffers.fill(layout, requests)
    started = time.perf_counter()
    for _ in range(args.repeats):
        buffers.fill(layout, requests)
    print(f"StepBuffers.fill, {args.rows} decode rows: {(time.perf_counter() - started) / args.repeats * 1e3:.3f} ms")


def time_after_forward(args, frames_per_request: int = 100) -> None:
    config = VoxServeConfig.from_dict({"codec_mode": "lanes", "max_codec_slots": 4 * args.rows})
    runtime = codecless_runtime(config)
    runtime.model = source = SteadyStreams(runtime, args.rows, lambda: frames_per_request)
    spent = 0.0
    for i in range(args.repeats + 20):
        source.refill()
        started = time.perf_counter()
        runtime._after_forward()
        if i >= 20:
            spent += time.perf_counter() - started
        runtime.step_report(costs=False)
        source.finish_done()
    print(f"SpeechRuntime.after_forward, {args.rows} decode rows (lanes mode, no codec work): "
          f"{spent / args.repeats * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
