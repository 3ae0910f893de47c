"""The served arrangement, side by side: the backbone's decode step on the whole GPU (as vLLM's graphs run)
captured at a stream priority, beside the codec's background batches on the codec partition.

A graph runs at the priority of the stream it was captured on (notes/green-contexts.md), and a stream's priority only
orders which pending thread blocks an SM takes next: a higher-priority backbone takes the codec partition's SMs as the
codec's blocks finish, and the codec runs in what the backbone leaves. Served at 112 req/s (run 2026-12-02_f0a91d7),
decode steps took about 1.5x their codec-inline time beside a busy codec lane, at equal priorities.

For each codec partition size and backbone priority: both graphs replayed back to back on their streams at once; the
per-replay times inside the span where both run give each side's rate under contention (frames per second), and
min(backbone, codec) the frame rate both keep up with. Each alone too. Backbone: `fig3.backbone` (talker + compiled
code predictor, random weights, no vLLM); codec: the real decoder in the served form (`fig3.measure.build_codec`).

    python -m benchmarks.backbone_priority --codec-sms 64,96 --backbone-batch 192 --out priority.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.fig3.backbone import backbone_step_factory
from benchmarks.fig3.measure import build_codec
from benchmarks.split_chooser import codec_step_factory
from vllm_voxserve.codec_lanes.executables import capture_step_graphs
from vllm_voxserve.codec_lanes.partitions import SplitSpec, shared_partitions
from vllm_voxserve.config import BACKBONE_PRIORITIES, backbone_stream_priority


def alone_ms(graph, stream, reps: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        graph.replay()
        start.record(stream)
        for _ in range(reps):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / reps


def overlapped_ms(sides: list[tuple[object, object, int]]) -> list[float]:
    """sides: (graph, launch stream, replays) each, launched at once; the mean time of each side's replays that lie
    wholly inside the span where every side is still replaying."""
    ref = torch.cuda.Event(enable_timing=True)
    ref.record(torch.cuda.current_stream())
    marks = []
    for graph, stream, reps in sides:
        stream.wait_event(ref)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        with torch.cuda.stream(stream):
            events[0].record(stream)
            for event in events[1:]:
                graph.replay()
                event.record(stream)
        marks.append(events)
    torch.cuda.synchronize()
    return mean_inside_common_span([[ref.elapsed_time(e) for e in events] for events in marks])


def mean_inside_common_span(marks: list[list[float]]) -> list[float]:
    """marks: each side's replay boundaries (ms, one clock). The mean replay of each side among those wholly inside
    the span where every side was replaying: the rest ran beside fewer sides, partly or wholly alone."""
    lo, hi = max(t[0] for t in marks), min(t[-1] for t in marks)
    out = []
    for t in marks:
        inside = [b - a for a, b in zip(t, t[1:]) if a >= lo and b <= hi]
        if not inside:
            raise RuntimeError("a side has no replay inside the common span: raise the window")
        out.append(sum(inside) / len(inside))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec-sms", default="64,96")
    ap.add_argument("--backbone-batch", type=int, default=192)
    ap.add_argument("--context", type=int, default=200, help="K/V positions each backbone step attends over")
    ap.add_argument("--codec-batch", type=int, default=64)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--window-ms", type=float, default=1500.0)
    ap.add_argument("--priorities", default=",".join(BACKBONE_PRIORITIES), help="backbone priorities to time")
    ap.add_argument("--out", default="priority.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    codec = build_codec(torch.bfloat16, True)  # the served form
    make_codec = codec_step_factory(codec, args.frames, torch.device("cuda"))
    make_backbone = backbone_step_factory(context=args.context)
    least, greatest = torch.cuda.Stream.priority_range()
    priorities = {name: backbone_stream_priority(name, least, greatest) for name in args.priorities.split(",")}
    t0 = time.perf_counter()
    result = dict(gpu=torch.cuda.get_device_name(), sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
                  workload=vars(args), priorities=priorities, alone={}, side_by_side=[])

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    backbone = {}  # priority name -> (graph, its capture stream, which also launches it)
    for name, priority in priorities.items():
        stream = torch.cuda.Stream(priority=priority)
        backbone[name] = (capture_step_graphs(make_backbone, [args.backbone_batch], stream)[args.backbone_batch],
                          stream)
        result["alone"][f"backbone_{name}_ms"] = alone_ms(*backbone[name])
        save()
    frames_per_step, frames_per_batch = args.backbone_batch, args.codec_batch * args.frames
    for n in (int(s) for s in args.codec_sms.split(",")):
        parts = shared_partitions(SplitSpec("codec", n))
        graph = capture_step_graphs(make_codec, [args.codec_batch], parts.codec_stream)[args.codec_batch]
        codec_alone = alone_ms(graph, parts.codec_launch_stream)
        result["alone"][f"codec_{parts.codec_sms}sms_ms"] = codec_alone
        for name, (bb_graph, bb_stream) in backbone.items():
            bb_alone = result["alone"][f"backbone_{name}_ms"]
            step_ms, batch_ms = overlapped_ms([(bb_graph, bb_stream, max(3, int(args.window_ms / bb_alone))),
                                               (graph, parts.codec_launch_stream,
                                                max(3, int(args.window_ms / codec_alone)))])
            row = dict(codec_sms=parts.codec_sms, backbone_priority=name, backbone_step_ms=round(step_ms, 3),
                       codec_batch_ms=round(batch_ms, 3), backbone_frames_per_s=round(frames_per_step * 1e3 / step_ms),
                       codec_frames_per_s=round(frames_per_batch * 1e3 / batch_ms))
            row["both_keep_up_frames_per_s"] = min(row["backbone_frames_per_s"], row["codec_frames_per_s"])
            result["side_by_side"].append(row)
            print(json.dumps(row), flush=True)
            save()
        del graph
    print(json.dumps(result["alone"]), flush=True)


if __name__ == "__main__":
    main()
