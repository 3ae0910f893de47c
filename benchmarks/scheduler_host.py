"""The speech scheduler's host time per engine step at a steady load, on this machine's CPU (vLLM's CPU build).

    python -m benchmarks.scheduler_host --rate 80 --step-ms 14.5 [--steps 400] [--config JSON] [--profile]

vLLM's real `Scheduler` with our policy (`scheduler.adapter`) on a fake clock that advances `--step-ms` a step:
requests arrive at `--rate` per second (evenly spaced), each generates a fixed number of frames (spread around
`--frames`) and the fake worker's step report says its chunks are decoded as soon as they are cut; a finished
request stays in the report for `--drain-steps` steps (its last audio still decoding). Prints the host time of
`schedule()` and `update_from_output()` per step (vLLM's own scheduling included) at the load's running requests;
`--config` sets `voxserve` keys (e.g. '{"scheduler": {"overload_mode": "off"}}'). Host times are this CPU's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import time

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the scheduler's rules for the V1 runner (what runs on CPU)

from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from benchmarks.cpu_scheduler import cpu_scheduler

try:  # where the step report lives moved; the script runs on either layout
    from vllm_voxserve.compat import attach_step_report
    from vllm_voxserve.contract import RequestProgress, StepReport
except ImportError:
    from vllm_voxserve.scheduler.adapter import attach_report as attach_step_report
    from vllm_voxserve.scheduler.report import RequestProgress, StepReport

BLOCKS = 16000


def additional_config(tree: dict) -> dict:
    try:
        from vllm_voxserve.config import as_additional_config
    except ImportError:
        return {"voxserve": tree}
    return as_additional_config(tree)


def build(tree: dict, max_num_seqs: int):
    scheduler, clock = cpu_scheduler(additional_config(tree), max_num_seqs, BLOCKS)
    scheduler.host_times.report = lambda line: None
    return scheduler, clock


class FakeWorker:
    """Audio progress as the worker reports it: chunks decoded as soon as they are cut, finished requests' audio
    for `drain_steps` more steps."""

    def __init__(self, first: int, size: int, drain_steps: int) -> None:
        self.first, self.size, self.drain_steps = first, size, drain_steps
        self.first_audio: dict[str, float] = {}
        self.frames: dict[str, int] = {}
        self.draining: dict[str, int] = {}

    def chunks(self, frames: int) -> int:
        return 0 if frames < self.first else 1 + (frames - self.first) // self.size

    def report(self, scheduler, now: float) -> StepReport:
        progress = []
        for rid, request in scheduler.requests.items():
            if request.is_finished() or request.num_output_tokens == 0:
                continue
            frames = request.num_output_tokens - 1
            self.frames[rid] = frames
            chunks = self.chunks(frames)
            if chunks and rid not in self.first_audio:
                self.first_audio[rid] = now
            progress.append(RequestProgress(rid, frames, False, chunks, chunks * self.size * 0.08,
                                            self.first_audio.get(rid)))
        for rid in [r for r in self.frames if r not in scheduler.requests or scheduler.requests[r].is_finished()]:
            self.draining.setdefault(rid, self.drain_steps)
            del self.frames[rid]
        for rid in list(self.draining):
            self.draining[rid] -= 1
            if self.draining[rid] < 0:
                del self.draining[rid]
                self.first_audio.pop(rid, None)
                continue
            progress.append(RequestProgress(rid, 0, False, 1, 0.4, self.first_audio.get(rid), True))
        return StepReport(now, progress)


def run(rate: float, step_s: float, steps: int, warmup: int, frames: int, drain_steps: int, tree: dict,
        profile: cProfile.Profile | None) -> dict:
    scheduler, clock = build(tree, max_num_seqs=384)
    worker = FakeWorker(tree.get("first_chunk_frames", 5), tree.get("chunk_frames", 10), drain_steps)
    rng = random.Random(0)
    next_arrival, n = clock.t, 0
    schedule_s, update_s, running, arrivals_s = [], [], [], 0.0
    for i in range(warmup + steps):
        arriving = time.perf_counter()
        while next_arrival <= clock.t:
            length = max(10, round(frames * rng.uniform(0.5, 1.5)))
            params = SamplingParams(max_tokens=length + 1, extra_args={"voxserve": {"fixed_length": True}})
            scheduler.add_request(Request(f"r{n}", [0] * 30, params, None, arrival_time=clock.t))
            n += 1
            next_arrival += 1.0 / rate
        if i >= warmup:
            arrivals_s += time.perf_counter() - arriving
        if i == warmup and profile is not None:
            profile.enable()
        started = time.perf_counter()
        out = scheduler.schedule()
        scheduled = time.perf_counter()
        clock.t += step_s
        ids = list(out.num_scheduled_tokens)
        sampled = [[1] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_prompt_tokens else []
                   for r in ids]
        output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                   sampled_token_ids=sampled)
        report = worker.report(scheduler, clock.t)
        attach_step_report(output, lambda: report)
        before_update = time.perf_counter()
        scheduler.update_from_output(out, output)
        ended = time.perf_counter()
        if i >= warmup:
            schedule_s.append(scheduled - started)
            update_s.append(ended - before_update)
            running.append(len(ids))
    if profile is not None:
        profile.disable()
    schedule_s.sort(), update_s.sort()
    middle = len(schedule_s) // 2
    return {"rate": rate, "step_ms": step_s * 1e3, "running_mean": sum(running) / len(running),
            "schedule_ms_p50": schedule_s[middle] * 1e3, "update_ms_p50": update_s[middle] * 1e3,
            "arrivals_ms_per_step": arrivals_s / steps * 1e3,
            "schedule_ms_mean": sum(schedule_s) / len(schedule_s) * 1e3,
            "update_ms_mean": sum(update_s) / len(update_s) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--step-ms", type=float, default=14.5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--frames", type=int, default=97)
    ap.add_argument("--drain-steps", type=int, default=20)
    ap.add_argument("--config", default="{}", help="voxserve keys as JSON (first_chunk_frames 5 unless set)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    tree = {"first_chunk_frames": 5, "max_codec_slots": 512, **json.loads(args.config)}
    tree["scheduler"] = {"max_decode_batch": 384, **tree.get("scheduler", {})}
    profile = cProfile.Profile() if args.profile else None
    r = run(args.rate, args.step_ms / 1e3, args.steps, args.warmup, args.frames, args.drain_steps, tree, profile)
    print(f"rate {r['rate']:g}/s, step {r['step_ms']:.1f} ms, {r['running_mean']:.0f} rows a step: schedule "
          f"{r['schedule_ms_p50']:.3f} ms p50 ({r['schedule_ms_mean']:.3f} mean), update {r['update_ms_p50']:.3f} p50 "
          f"({r['update_ms_mean']:.3f} mean), arrivals (add_request) {r['arrivals_ms_per_step']:.3f} a step")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
