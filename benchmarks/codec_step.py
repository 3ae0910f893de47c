"""Codec executable time on one GPU: the served decoder's graph uncompiled and torch.compile'd, side by side.

    python -m benchmarks.codec_step --batches 1,16,32 --frames 5,10 --out codec.json [--codec-sms 32]

The real 12 Hz decoder shape (random weights, bf16 state and weights) in its served conv forms, exact incremental
decode from a state pool, one CUDA graph per (variant, batch, frames), replays timed with CUDA events: on the whole GPU,
and with `--codec-sms N` also on an N-SM codec partition (driver green context; nothing else running). `compile_s` is
the wall time of the first compiled call of that shape (0 when it reused a graph). Variants: `graph` (uncompiled) and
`graph+compile` (the served form: a compile per chunk length). Each variant's samples are compared with the first
variant's ("rms deviation"). cuDNN picks its convolution algorithms by heuristics, as in the server (its timed search
was faster on the whole GPU but broke the codec partition's capture at served batch sizes).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from benchmarks.code_predictor_step import profile_kernels
from benchmarks.fig3.measure import graph_ms
from vllm_voxserve.codec_lanes.partitions import SplitSpec, create_partitions
from vllm_voxserve.models.qwen3_tts.codec import tma_conv
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram

VARIANTS = ("graph", "graph+compile")
DEVIATION = "rms deviation"


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,32")
    ap.add_argument("--frames", default="5,10")
    ap.add_argument("--codec-sms", type=int)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="graph,graph+compile")
    ap.add_argument("--profile-batch", type=int, default=0, help="print each variant's kernels at this batch")
    ap.add_argument("--conv-tiles", help="tiles for the TMA conv kernel (codec_conv_tiles.py's JSON; else its own)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.conv_tiles:
        with open(args.conv_tiles) as f:
            chosen = json.load(f)["chosen"]
        tma_conv.TILES.update({int(k): tuple(v) for k, v in chosen.items()})
    decoder = CodecDecoder(CodecDecoderConfig()).eval()
    init_codec_decoder_weights(decoder, seed=0)
    decoder = decoder.to("cuda", torch.bfloat16)
    batches, frame_counts = [int(b) for b in args.batches.split(",")], [int(f) for f in args.frames.split(",")]
    programs = {name: make_program(decoder, name) for name in args.variants.split(",")}
    whole = torch.cuda.Stream()
    places = [("whole GPU", whole, whole)]
    if args.codec_sms:
        parts = create_partitions(SplitSpec("codec", args.codec_sms))
        places.append((f"{parts.codec_sms} SMs", parts.codec_stream, parts.codec_launch_stream))
    rows = []
    for frames in frame_counts:
        for batch in batches:
            g = torch.Generator(device="cuda").manual_seed(batch)
            codes = torch.randint(0, 2048, (batch, frames, 16), device="cuda", generator=g)
            row, first = {"batch": batch, "frames": frames}, None
            for name, program in programs.items():
                try:
                    timed, wav = time_variant(name, program, codes, places, args.reps,
                                              profile=batch == args.profile_batch)
                except RuntimeError as exc:  # e.g. a cuDNN refusal: keep the other variants' timings
                    row[f"{name} error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    continue
                row.update(timed)
                # every form decodes the same codes from a fresh state: its samples against the first form's
                first = first or (name, wav)
                if name != first[0]:
                    row[f"{name} {DEVIATION}"] = round(relative_rms(wav, first[1]), 5)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every row, so a crash keeps what was measured
                with open(args.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                              indent=1)


def relative_rms(wav: torch.Tensor, reference: torch.Tensor) -> float:
    return ((wav.float() - reference.float()).pow(2).mean().sqrt() / reference.float().pow(2).mean().sqrt()).item()


def time_variant(name: str, program: Qwen3CodecProgram, codes: torch.Tensor, places, reps: int,
                 profile: bool = False) -> tuple[dict, torch.Tensor]:
    """Compile (if so) and time one variant's graph at each place; `profile` also prints its kernels (whole GPU).
    Returns the timings and the samples of its first call (from a fresh state)."""
    batch = codes.shape[0]
    pool = program.make_state_pool(batch + 1, torch.device("cuda"))
    slots = torch.arange(batch, device="cuda")
    row = {}
    started = time.perf_counter()
    wav = program.decode(codes, slots, pool)
    torch.cuda.synchronize()
    if "compile" in name:
        row[f"{name} compile_s"] = round(time.perf_counter() - started, 1)
    step = lambda: program.decode(codes, slots, pool)  # noqa: E731
    for where, capture, launch in places:
        row[f"{name} ms ({where})"] = graph_ms(lambda _batch: step, batch, capture, launch, reps)
    if profile:
        print(f"{name}, {batch} chunks of {codes.shape[1]} frames, whole GPU:", flush=True)
        profile_kernels(step)
        if "compile" not in name:
            profile_convolutions(step, torch.profiler.ProfilerActivity.CUDA)
    return row, wav


def profile_convolutions(step, device_activity) -> None:
    """Print each convolution's input shapes and device time, from one eager call: a graph replay's kernels
    name no op, and a slow cuDNN call could be any of several convs."""
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, device_activity],
                                record_shapes=True) as prof:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    rows = [e for e in prof.events() if e.name == "aten::convolution"]
    print(f"convolutions of one eager call: {len(rows)}", flush=True)
    for e in sorted(rows, key=lambda e: -e.device_time_total):
        args = list(getattr(e, "concrete_inputs", None) or [])  # stride, padding, dilation, transposed, ..., groups
        print(f"{e.device_time_total / 1e3:8.3f} ms  input, weight {e.input_shapes[:2]}  {args[3:]}", flush=True)


def make_program(decoder: CodecDecoder, variant: str) -> Qwen3CodecProgram:
    """One of VARIANTS, on its own copy of the decoder (the program sets the convs' forms; each compiled program
    compiles its own graphs)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    return Qwen3CodecProgram(copy.deepcopy(decoder), torch.bfloat16, compile=variant == "graph+compile")


if __name__ == "__main__":
    main()
