"""Figure 3 (paper §2.3) on one GPU: backbone speed vs SMs, split Pareto, codec latency.

Backbone: one decode step of Qwen3-TTS-1.7B as the served model computes it (`backbone.py`: the talker's 28
layers over a `--context`-position K/V cache, codec head, and the compiled code-predictor frame; random weights,
bf16), without vLLM's own kernels. Codec: the real Qwen3-TTS 12 Hz decoder (random weights) through
`Qwen3CodecProgram`, one chunk of `--frames` frames per request.
Every measurement is a CUDA graph: captured on the partition, replayed from a
primary-context stream, timed with CUDA events.

    python -m benchmarks.fig3.measure --out fig3.json && python -m benchmarks.fig3.plot fig3.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.fig3.backbone import backbone_step_factory
from benchmarks.split_chooser import CODEC_HEADROOM, Workload, choose_split, codec_step_factory, profile_splits
from vllm_voxserve.codec_lanes.executables import capture_step_graphs
from vllm_voxserve.codec_lanes.partitions import SplitSpec, shared_partitions


def graph_ms(make_step, batch: int, capture_stream, launch_stream, reps: int = 20) -> float:
    graph = capture_step_graphs(make_step, [batch], capture_stream)[batch]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(launch_stream):
        graph.replay()
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def build_codec(dtype: torch.dtype, compile: bool):
    """The real-shaped codec (random weights) as a program on the GPU, in its served conv forms."""
    from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
    from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
    from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
    from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram

    decoder = CodecDecoder(CodecDecoderConfig()).eval()
    init_codec_decoder_weights(decoder, seed=0)
    return Qwen3CodecProgram(decoder.to("cuda", dtype), state_dtype=dtype, compile=compile)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec-sms", default="16,24,32,48,64,80")
    ap.add_argument("--backbone-batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256, help="K/V positions each backbone step attends over")
    ap.add_argument("--codec-batch", type=int, default=16)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--codec-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--no-codec-compile", action="store_true", help="the codec uncompiled (served default: compiled)")
    ap.add_argument("--codec-headroom", type=float, default=CODEC_HEADROOM,
                    help="codec frames per backbone frame a split must measure to keep up (split_chooser)")
    ap.add_argument("--skip-alone", action="store_true", help="no per-partition solo runs (a), to isolate a crash")
    ap.add_argument("--out", default="fig3.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.codec_dtype == "bf16" else torch.float32
    backbone = backbone_step_factory(context=args.context)
    codec = build_codec(dtype, not args.no_codec_compile)
    codec_step = codec_step_factory(codec, args.frames, torch.device("cuda"))
    splits = [int(s) for s in args.codec_sms.split(",")]
    t0 = time.perf_counter()
    # saved after every stage: a crash (the H200 runs of this script segfaulted inside profile_splits) keeps the rest
    result = dict(gpu=torch.cuda.get_device_name(), sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
                  codec_dtype=args.codec_dtype, workload=vars(args), alone=[], side_by_side=[])

    def save() -> None:
        result["seconds"] = time.perf_counter() - t0
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    # (a) backbone alone on each LM partition size, and both components alone on the whole GPU
    whole = shared_partitions(SplitSpec("codec", splits[0]))  # its urgent stream is the whole GPU
    full = dict(backbone_step_ms=graph_ms(backbone, args.backbone_batch, whole.urgent_stream, whole.urgent_stream),
                **{f"codec_batch{b}_ms": graph_ms(codec_step, b, whole.urgent_stream, whole.urgent_stream)
                   for b in (1, args.codec_batch)})
    result["whole_gpu"] = full
    save()
    for n in splits if not args.skip_alone else ():
        parts = shared_partitions(SplitSpec("codec", n))  # kept for the process, as profile_splits does
        result["alone"].append(dict(lm_sms=parts.lm_sms, codec_sms=parts.codec_sms,
                                    backbone_step_ms=graph_ms(backbone, args.backbone_batch, parts.lm_stream,
                                                              parts.lm_launch_stream),
                                    # the whole GPU again right after: the share in (a) is a side-by-side ratio
                                    # (two H200 runs of the first whole-GPU figure differed by 7 %)
                                    backbone_whole_gpu_ms=graph_ms(backbone, args.backbone_batch,
                                                                   whole.urgent_stream, whole.urgent_stream),
                                    codec_batch1_ms=graph_ms(codec_step, 1, parts.codec_stream,
                                                             parts.codec_launch_stream)))
        save()

    # (b) side by side on each split, (c) codec latency beside the backbone
    side = []
    for n in splits:
        spec = SplitSpec("codec", n)
        (m,) = profile_splits([spec], backbone, codec_step,
                              Workload(args.backbone_batch, args.codec_batch, args.frames), window_ms=300.0)
        (one,) = profile_splits([spec], backbone, codec_step, Workload(args.backbone_batch, 1, args.frames),
                                window_ms=150.0)
        side.append(m)
        result["side_by_side"].append(dict(
            lm_sms=m.lm_sms, codec_sms=m.codec_sms, backbone_step_ms=m.backbone_step_ms, codec_batch_ms=m.codec_batch_ms,
            codec_batch1_ms=one.codec_batch_ms, backbone_frames_per_s=m.backbone_frames_per_s,
            codec_frames_per_s=m.codec_frames_per_s, codec_margin=m.codec_margin,
            keeps_up=m.codec_margin >= args.codec_headroom))
        save()
    choice = choose_split(side, args.codec_headroom)
    result.update(chosen_codec_sms=choice.best.codec_sms, chosen_keeps_up=choice.codec_keeps_up)
    save()
    by24 = {m["codec_sms"]: m for m in result["side_by_side"]}.get(24)
    print(f"fig3: backbone step {full['backbone_step_ms']:.3f} ms whole GPU; codec batch1 "
          f"{full['codec_batch1_ms']:.2f} ms / batch{args.codec_batch} {full[f'codec_batch{args.codec_batch}_ms']:.2f}"
          f" ms whole GPU" + (f", {by24['codec_batch1_ms']:.2f} / {by24['codec_batch_ms']:.2f} ms on 24 SMs beside"
                              " the backbone" if by24 else "") + f"; chosen codec SMs {choice.best.codec_sms}")


if __name__ == "__main__":
    main()
