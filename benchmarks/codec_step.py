"""Codec executable time on one GPU: the decoder's graph as it runs today vs torch.compile'd, side by side.

    python -m benchmarks.codec_step --batches 1,16,32 --frames 5,10 --out codec.json [--codec-sms 32]

The real 12 Hz decoder shape (random weights, bf16 state and weights), exact incremental decode from a state pool, one
CUDA graph per (variant, batch, frames), replays timed with CUDA events: on the whole GPU, and with `--codec-sms N` also
on an N-SM codec partition (driver green context; nothing else running). `compile_s` is the wall time of the first
compiled call of that shape (0 when it reused a graph). `--variants graph` skips the compile;
`graph+compile+static-frames` compiles one graph per chunk length, as the server does with `codec_dynamic_frames:
false`; `graph+compile+1x1mm` lets inductor run the codec's 1x1 convolutions as matrix multiplies
(`codec_conv_1x1_as_mm`) instead of cuDNN convolutions with their layout conversions; `graph+compile+nhwc` runs the
convs channels-last (`Qwen3CodecProgram(channels_last=True)`); `+gemm` runs the convs before the upsampling (the two at
the frame rate and the upsampler's two transposed convs) as matmuls (`gemm_low_rate_convs=True`), `+dgemm` the wide
dilated convs (`gemm_wide_dilated_convs=True`), `+dgemmN` those of at least N channels (`gemm_dilated_min_channels=N`),
`+adgemm` every dilated conv; `+ttail` runs the vocoder's residual units' SnakeBeta -> conv k1 -> + input on the
plugin's Triton conv kernel (`conv_kernels="tails"`), `+tdil` their dilated convs that are not matmuls (`"dilated"`),
`+tk7` every k7 conv that is not a matmul (`"k7"`), `+tconv` the tails and every k7 conv (`"all"`); `+tma` runs the k7
convs on a kernel on the TMA kernel (`conv_tma=True`, codec/tma_conv.py); `+nolayout` compiles without inductor's layout
optimization (`layout_optimization=False`); `+bounded` with the batch and the chunk length bounded by the largest timed
(`shape_bounds`); `+rows16` decodes the batch as calls of at most 16 rows, one after another in the one graph
(`rows_per_call=16`). cuDNN picks its convolution algorithms by heuristics, as in the server (its timed search was
faster on the whole GPU but broke the codec partition's capture at served batch sizes:
results/h200/2026-11-30_session5).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from benchmarks.code_predictor_step import profile_kernels
from benchmarks.codec_layout_choice import DEVIATION, forms
from benchmarks.fig3.measure import graph_ms
from vllm_voxserve.codec_lanes.partitions import SplitSpec, create_partitions
from vllm_voxserve.config import codec_call_shape
from vllm_voxserve.models.qwen3_tts.codec import conv_kernels, tma_conv
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram, form_arguments


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,32")
    ap.add_argument("--frames", default="5,10")
    ap.add_argument("--codec-sms", type=int)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="graph,graph+compile")
    ap.add_argument("--profile-batch", type=int, default=0, help="print each variant's kernels at this batch")
    ap.add_argument("--conv-tiles", help="tiles for the conv kernels (codec_conv_tiles.py's JSON; else their own)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.conv_tiles:
        with open(args.conv_tiles) as f:
            chosen = json.load(f)["chosen"]
        conv_kernels.TILES.update({tuple(json.loads(k.replace("(", "[").replace(")", "]"))): tuple(v)
                                   for k, v in chosen.items() if not k.startswith("tma ")})
        tma_conv.TILES.update({int(k.split()[1]): tuple(v) for k, v in chosen.items() if k.startswith("tma ")})
    decoder = CodecDecoder(CodecDecoderConfig()).eval()
    init_codec_decoder_weights(decoder, seed=0)
    decoder = decoder.to("cuda", torch.bfloat16)
    batches, frame_counts = [int(b) for b in args.batches.split(",")], [int(f) for f in args.frames.split(",")]
    programs = {name: make_program(decoder, name, (max(batches), max(frame_counts)))
                for name in args.variants.split(",")}
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
    name no op, and two slow cuDNN calls a batch (session 6) could be any of several convs."""
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


def make_program(decoder: CodecDecoder, variant: str, call_bounds: tuple[int, int] = (64, 10)) -> Qwen3CodecProgram:
    """`graph`, `graph+compile` (cuDNN convs; the server's default is `+dgemm+tdil+static-frames` since session 14),
    with any of `static-frames`, `1x1mm`, `nhwc` (the convs channels-last), `gemm` (the low-rate convs as matmuls),
    `dgemm` (the wide dilated ones), `ttail`/`tdil`/`tk7`/`tconv`, `tma`, `nolayout`, `bounded` (sizes bounded by
    `call_bounds`, most rows and frames of a call) and `rowsN` (calls of at most N rows) added
    (`codec_layout_choice.forms`);
    compiled or changed variants on a copy of the decoder."""
    options = variant.split("+")
    try:
        settings = forms([o for o in options[1:] if o != "compile"])
    except ValueError:
        settings = None
    if options[0] != "graph" or settings is None:
        raise ValueError(f"unknown variant {variant!r}")
    # A compiled or changed variant gets its own copy of the decoder (the forms change its modules); each program
    # compiles its own graphs (`codec_program._OwnInductor`: before it, a static-frames variant ran the dynamic
    # variant's graphs, compile_s 0 and the same kernels, in sessions 6 and 14).
    compiled = "compile" in options
    changed = any(settings[key] != value for key, value in forms([]).items() if key != "codec_dynamic_frames")
    return Qwen3CodecProgram(copy.deepcopy(decoder) if compiled or changed else decoder, torch.bfloat16,
                             compile=compiled, **form_arguments(settings),
                             shape_bounds=codec_call_shape(*call_bounds, settings["codec_rows_per_call"])
                             if settings["codec_bounded_shapes"] else None)


if __name__ == "__main__":
    main()
