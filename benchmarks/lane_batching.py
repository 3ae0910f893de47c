"""The codec lanes' batching at a given load, on this machine's CPU, with the lanes' device time simulated.

    python -m benchmarks.lane_batching --streams 150 --step-ms 14.5,20 [--steps 600] [--config JSON] [--profile]

The worker's real audio pipeline and lane dispatch (`SpeechRuntime._after_forward`: frames to streams, chunks cut,
the pump's harvest, plan and launch) run against a codec that decodes nothing; what a GPU would add is simulated on
a clock that advances `--step-ms` per engine step: each lane batch finishes after its device time by the H200 cost
seed (`costs.h200_seed`, at the batch's executable bucket), one batch after another on its lane. `--streams`
requests generate one frame a step each (lengths spread around `--frames`); one that ends is replaced by a new one.

Prints per step interval: background and urgent batches (count per step, mean size, the lane's busy share), and the
pump's host time per step on this CPU by part (harvest, deliver, plan, launch): how the engine step interval sets
the background batches and so the host work the pump does each step. The simulated device time is an assumption
(the seed's lines); the host times are this CPU's, not the GPU host's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random

from benchmarks.codecless_runtime import SteadyStreams, codecless_runtime
from vllm_voxserve.codec_lanes import codec_lane
from vllm_voxserve.config import VoxServeConfig

# The H200's codec lines (`costs.h200_seed`, run 2026-12-02_78cd88a): background on 64 SMs beside the backbone,
# urgent on the whole GPU; written out so that the same script runs at commits before that seed existed.
_DEVICE_S = {codec_lane.LaneKind.URGENT: (1.7e-3, (4.0e-3 - 1.7e-3) / 7),
             codec_lane.LaneKind.BACKGROUND: (6.0e-3 - 4 * (45.6e-3 - 6.0e-3) / 60, (45.6e-3 - 6.0e-3) / 60)}


class SimClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _SimEvent:
    """A CUDA event's part the lanes use, on the simulated clock."""

    def __init__(self, clock: SimClock, at: float) -> None:
        self.clock, self.at = clock, at

    def query(self) -> bool:
        return self.clock.t >= self.at

    def synchronize(self) -> None:
        self.clock.t = max(self.clock.t, self.at)

    def elapsed_time(self, end: "_SimEvent") -> float:
        return (end.at - self.at) * 1e3


class SimulatedLanes:
    """Patches `CodecLane.launch` so that each batch finishes after its simulated device time, in launch order."""

    def __init__(self, clock: SimClock) -> None:
        self.clock, self.free_at, self.batches, self.turned_urgent = clock, {}, [], 0

    def install(self) -> None:
        """Until `uninstall`: every CodecLane of this process launches on the simulated clock."""
        self.original = original = codec_lane.CodecLane.launch
        sim = self

        def launch(lane, chunks, slots, fresh_slots):
            original(lane, chunks, slots, fresh_slots)
            bucket = min(b for b in lane.executables.buckets if b >= len(chunks))
            fixed, per_chunk = _DEVICE_S[lane.kind]
            start = max(sim.clock.t, sim.free_at.get(lane.kind, 0.0))
            end = start + fixed + per_chunk * bucket
            sim.free_at[lane.kind] = end
            batch = lane._in_flight[-1]
            batch.start, batch.done = _SimEvent(sim.clock, start), _SimEvent(sim.clock, end)
            sim.batches.append((lane.kind.value, len(chunks), end - start))
            if lane.kind is codec_lane.LaneKind.URGENT:  # chunks past their first that turned urgent
                sim.turned_urgent += sum(c.chunk_index > 0 for c in chunks)

        codec_lane.CodecLane.launch = launch

    def uninstall(self) -> None:
        codec_lane.CodecLane.launch = self.original


def run(streams: int, step_s: float, steps: int, frames: int, warmup: int, profile: cProfile.Profile | None,
        config_tree: dict | None = None) -> dict:
    clock = SimClock()
    sim = SimulatedLanes(clock)
    tree = {"codec_mode": "lanes", "max_codec_slots": 4 * streams, **(config_tree or {})}
    config = VoxServeConfig.from_tree(tree) if hasattr(VoxServeConfig, "from_tree") else VoxServeConfig.from_dict(tree)
    runtime = codecless_runtime(config, clock=clock)
    rng = random.Random(0)
    runtime.model = source = SteadyStreams(runtime, streams, lambda: max(8, round(frames * rng.uniform(0.5, 1.5))))
    lanes = runtime.pipeline.lanes
    sim.install()
    try:
        parts = dict.fromkeys(lanes.pump_seconds, 0.0)
        per_step: list[float] = []  # the pump's host seconds of each counted step (the step log's gauge)
        counted_from = None
        for i in range(warmup + steps):
            if i == warmup:
                counted_from, sim.batches, sim.turned_urgent = clock.t, [], 0
                for part in lanes.pump_seconds:
                    lanes.pump_seconds[part] = 0.0
                if profile is not None:
                    profile.enable()
            source.refill()
            runtime._after_forward()
            runtime.step_report(costs=False)
            source.finish_done()
            if i >= warmup:
                for part, seconds in lanes.pump_seconds.items():
                    parts[part] += seconds
                per_step.append(sum(lanes.pump_seconds.values()))
            for part in lanes.pump_seconds:
                lanes.pump_seconds[part] = 0.0
            clock.t += step_s
        if profile is not None:
            profile.disable()
    finally:
        sim.uninstall()
    wall = clock.t - counted_from
    result = {"streams": streams, "step_ms": step_s * 1e3, "steps": steps,
              "pump_us_per_step": {p: s / steps * 1e6 for p, s in parts.items()},
              "turned_urgent_per_step": sim.turned_urgent / steps,
              "pump_us_p50": sorted(per_step)[len(per_step) // 2] * 1e6, "pump_us_mean": sum(per_step) / steps * 1e6}
    for lane in ("background", "urgent"):
        sizes = [(n, s) for kind, n, s in sim.batches if kind == lane]
        result[lane] = {"batches_per_step": len(sizes) / steps,
                        "mean_batch": sum(n for n, _ in sizes) / len(sizes) if sizes else 0.0,
                        "busy": sum(s for _, s in sizes) / wall}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=150)
    ap.add_argument("--step-ms", default="14.5,20")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--frames", type=int, default=97, help="mean frames a request (LibriTTS test-clean: 97)")
    ap.add_argument("--profile", action="store_true", help="cProfile the counted steps (top 25 by own time)")
    ap.add_argument("--config", default="{}", help="voxserve keys as JSON")
    args = ap.parse_args()
    tree = json.loads(args.config)
    for step_ms in (float(s) for s in args.step_ms.split(",")):
        profile = cProfile.Profile() if args.profile else None
        r = run(args.streams, step_ms / 1e3, args.steps, args.frames, args.warmup, profile, tree)
        pump = r["pump_us_per_step"]
        background, urgent = r["background"], r["urgent"]
        print(f"{r['streams']} streams, step {r['step_ms']:.1f} ms: background {background['batches_per_step']:.2f}"
              f" batches/step of mean {background['mean_batch']:.1f}, busy {background['busy']:.0%}; "
              f"urgent {urgent['batches_per_step']:.2f}/step of mean {urgent['mean_batch']:.1f}, busy "
              f"{urgent['busy']:.0%} ({r['turned_urgent_per_step']:.2f} later chunks/step); pump us/step "
              + " ".join(f"{p} {v:.0f}" for p, v in pump.items())
              + f" (mean {r['pump_us_mean']:.0f}, p50 {r['pump_us_p50']:.0f})")
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
