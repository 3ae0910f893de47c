"""Code predictor frame time on one GPU: the reference frame vs the served (fused) frame, side by side in one run.

    python -m benchmarks.code_predictor_step --size 1.7b --batches 2,16,64,128 --out cp.json

Every variant runs as one CUDA graph per batch size (replays timed with CUDA events), random weights in bf16:
`reference` is `CodePredictor.predict_frame` (what the served step ran before the fused frame), `fused` is
`FusedCodePredictor.frame` without compilation, `fused+compile` the same torch.compile'd (what the server runs),
`fused+compile+kernels` with our Triton kernels for the attention and the top candidates (`code_predictor_kernels`).
All sample as the server does (temperature 0.9, top-k 50, per-row counter noise). `--autotune` adds
`fused+autotune` (inductor's max-autotune for the two compiled pieces: Triton GEMM templates with fused epilogues
tried against cuBLAS); `--profile-batch B` prints the kernels of one compiled frame at batch B (torch profiler).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vllm_voxserve.models.qwen3_tts.checkpoint import official_config, randomize_
from vllm_voxserve.models.qwen3_tts.code_predictor import CodePredictor
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.fused_code_predictor import FusedCodePredictor
from vllm_voxserve.models.seeded_noise import uniform_noise


def build(size: str, device: str) -> CodePredictor:
    talker = Qwen3TTSConfig.from_dict(official_config(size, "custom_voice")).talker_config
    cp = CodePredictor(talker.code_predictor_config, talker.hidden_size)
    c0_table = torch.nn.Embedding(talker.vocab_size, talker.hidden_size)
    randomize_(cp, torch.Generator().manual_seed(0))
    randomize_(c0_table, torch.Generator().manual_seed(1))
    cp.bind_codec_embedding(c0_table.to(device, torch.bfloat16))
    return cp.to(device, torch.bfloat16).eval()


def time_graph(fn, iters: int) -> tuple[float, torch.Tensor]:
    """Median ms of `iters` replays of one CUDA graph of fn (after two eager warm-ups)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(), fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], out.clone()


def make_variants(cp: CodePredictor, autotune: bool = False) -> dict[str, FusedCodePredictor | None]:
    """The frames compared, by name (None: the reference `CodePredictor.predict_frame`); compiled lazily."""
    variants: dict[str, FusedCodePredictor | None] = {"reference": None, "fused": FusedCodePredictor(cp)}
    for name, kernels, mode in (("fused+compile", False, None), ("fused+compile+kernels", True, None),
                                ("fused+autotune", False, "max-autotune-no-cudagraphs")):
        if name == "fused+autotune" and not autotune:
            continue
        variants[name] = FusedCodePredictor(cp, kernels=kernels)
        variants[name].compile(mode=mode)
    return variants


def profile_kernels(fn, replays: int = 5) -> None:
    """Print the kernels of `replays` replays of fn's CUDA graph, most device time first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in events)
    print(f"kernels of {replays} graph replays: {sum(e.count for e in events)} launches, {total / 1e3:.2f} ms device "
          f"time", flush=True)
    for e in sorted(events, key=lambda e: -e.device_time_total)[:30]:
        print(f"{e.device_time_total / 1e3:9.3f} ms {e.count:6d}x {e.device_time_total / max(e.count, 1):8.2f} us  "
              f"{e.key[:110]}", flush=True)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1.7b", choices=("0.6b", "1.7b"))
    parser.add_argument("--batches", default="2,16,64,128")  # the server runs it on >= 2 rows
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--profile-batch", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args()
    cp = build(args.size, "cuda")
    variants = make_variants(cp, args.autotune)
    compiled, with_kernels = variants["fused+compile"], variants["fused+compile+kernels"]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        g = torch.Generator(device="cuda").manual_seed(batch)
        hidden = torch.randn(batch, cp.small_to_mtp_projection.in_features if compiled.project_hidden else
                             cp.config.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
        c0 = torch.randint(0, 2048, (batch,), device="cuda", generator=g)
        temperature = torch.full((batch,), 0.9, device="cuda")
        top_k = torch.full((batch,), 50, device="cuda", dtype=torch.long)
        top_p = torch.ones(batch, device="cuda")
        seed = torch.randint(0, 2**31, (batch,), device="cuda", generator=g)
        frame = torch.zeros(batch, dtype=torch.long, device="cuda")
        fused_args = (hidden, c0, temperature, top_k, top_p, seed, frame)

        def reference():
            noise = uniform_noise(seed, frame, 15, cp.config.vocab_size)
            return cp.predict_frame(hidden, c0, temperature, top_k, top_p, uniform=noise)

        row = {"batch": batch}
        for name, variant in variants.items():
            if variant is not None and variant._compiled:
                started = time.perf_counter()
                variant.frame(*fused_args)
                row[f"{name}_compile_or_load_s"] = round(time.perf_counter() - started, 2)
        outs = {}
        for name, variant in variants.items():
            fn = reference if variant is None else (lambda v=variant: v.frame(*fused_args))
            row[f"{name}_ms"], outs[name] = time_graph(fn, args.iters)
        if batch == args.profile_batch:
            for variant in (compiled, with_kernels):
                profile_kernels(lambda v=variant: v.frame(*fused_args))
        # bf16 rounding differs between the variants, so report agreement instead of asserting equality
        row["codes_equal_to_reference"] = {k: float((v == outs["reference"]).float().mean()) for k, v in outs.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    record = {"device": torch.cuda.get_device_name(), "size": args.size, "torch": torch.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
