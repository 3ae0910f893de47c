"""Rate sweeps of the simulated server under named policy modes, pooled over seeds as in the paper (§4.1)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from benchmarks.simulation.server import GpuModel, SimulatedServer
from benchmarks.simulation.slo import RateResult, slo_capacity, summarize
from benchmarks.simulation.workload import load_word_counts, poisson_workload
from vllm_voxserve.scheduler.costs import h200_seed
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

MODES = {
    # the paper's baseline LM policy: admit every prefill at once, decode in arrival order
    "prefill_first": {"admission_mode": "prefill_first", "overload_mode": "off"},
    # VoxServe's deadline-aware admission and least-slack decode order, without shedding (as served: requests already
    # late left out of the slack, a full prefill when a deferral ends, no deferral past the oldest waiting request's
    # own deadline, where the paper's literal rule counts late requests, admits the oldest alone and weighs the
    # running requests only)
    "deadline_aware": {"admission_mode": "deadline_aware", "overload_mode": "off"},
    # ours: deadline-aware, plus 503 + Retry-After past capacity
    "deadline_aware_shed": {"admission_mode": "deadline_aware", "overload_mode": "reject"},
    # the same without the in-progress limit learned from delivered first audio: the cost model's rules alone
    "deadline_aware_shed_model": {"admission_mode": "deadline_aware", "overload_mode": "reject",
                                  "feedback_limit": False},
    # the same, admission weighing the backbone's frame rate alone (not the codec lane's)
    "deadline_aware_shed_backbone": {"admission_mode": "deadline_aware", "overload_mode": "reject",
                                     "codec_admission": False},
}

# The simulated GPU is the paper's H100, whose decode cost line is derived for full batches of 64 (costs.py): the
# simulation keeps that batch and the background batches it was calibrated with, whatever the served defaults.
PAPER_POLICY = SchedulerPolicyConfig(max_decode_batch=64, background_max_batch=32)

# The H200 as served in run 2026-12-02_78cd88a (costs.h200_seed states its sources): 384 decode rows, 64-chunk
# background batches on 64 codec SMs, 5-frame first chunks; 0.5 ms of host time a step (the served step log's median
# host gap before a backbone step was 0.21-0.42 ms at 120 req/s).
H200_POLICY = SchedulerPolicyConfig(max_decode_batch=384, background_max_batch=64, first_chunk_frames=5, codec_sms=64)
H200_GPU = GpuModel(seed=h200_seed(), host_overhead_s=0.5e-3, urgent_codec_interference=1.0)
GPUS = {"paper_h100": (PAPER_POLICY, GpuModel()), "h200": (H200_POLICY, H200_GPU)}

DRAIN_S = 120.0  # after the arrival window, let admitted requests finish (the paper's client waits up to 900 s)


def mode_config(mode: str, base: SchedulerPolicyConfig | None = None) -> SchedulerPolicyConfig:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {sorted(MODES)}")
    return (base or PAPER_POLICY).replace(**MODES[mode])


def simulate_rate(
    mode: str,
    rate: float,
    window_s: float,
    seeds: Sequence[int] = (0,),
    base: SchedulerPolicyConfig | None = None,
    gpu: GpuModel | None = None,
    word_counts: list[int] | None = None,
) -> RateResult:
    """One offered rate, pooled over `seeds` (each seed: its own arrivals, text order and cost jitter)."""
    cfg = mode_config(mode, base)
    outcomes, deferrals, batches = [], 0, Counter()
    for seed in seeds:
        server = SimulatedServer(cfg, gpu, seed)
        requests = poisson_workload(rate, window_s, seed, word_counts)
        outcomes += server.run(requests, window_s + DRAIN_S)
        deferrals += server.prefill_deferrals
        batches += server.codec_batches
    return summarize(mode, rate, window_s * len(seeds), outcomes, cfg.ttfa_target_s, deferrals, window_s, batches)


def sweep(
    mode: str,
    rates: Sequence[float],
    window_s: float,
    seeds: Sequence[int] = (0,),
    base: SchedulerPolicyConfig | None = None,
    gpu: GpuModel | None = None,
    word_counts: list[int] | None = None,
) -> list[RateResult]:
    words = word_counts if word_counts is not None else load_word_counts()
    return [simulate_rate(mode, rate, window_s, seeds, base, gpu, words) for rate in rates]


def capacity(results: Sequence[RateResult], threshold: float = 0.9) -> float:
    return slo_capacity({r.rate: r.attainment for r in results}, threshold)


def peak_goodput(results: Sequence[RateResult]) -> float:
    return max((r.goodput for r in results), default=0.0)


def parse_rates(text: str) -> list[float]:
    """"30:60:2" (start:stop:step, stop included) or "30,40,48"."""
    if ":" in text:
        start, stop, step = (float(x) for x in text.split(":"))
        if step <= 0 or stop < start:
            raise ValueError(f"bad rate range {text!r}")
        count = int(round((stop - start) / step)) + 1
        return [round(start + i * step, 6) for i in range(count)]
    return [float(x) for x in text.split(",") if x]


def study(
    modes: Sequence[str],
    rates: Sequence[float],
    window_s: float,
    seeds: Sequence[int] = (0,),
    overload_factors: Sequence[float] = (1.5,),
    reference_mode: str = "deadline_aware",
    base: SchedulerPolicyConfig | None = None,
    gpu: GpuModel | None = None,
    max_words: int | None = None,
) -> dict:
    """Sweep every mode, take `reference_mode`'s SLO capacity (at 90 %), and run every mode at each of
    `overload_factors` times it. Goodput there is given as a share of the mode's own peak and of that capacity.
    `max_words`: only texts of at most that many words."""
    words = load_word_counts(max_words=max_words)
    results = {m: sweep(m, rates, window_s, seeds, base, gpu, words) for m in modes}
    capacities = {m: capacity(r) for m, r in results.items()}
    reference = capacities.get(reference_mode) or max(capacities.values())
    overload: dict[str, dict] = {}
    for factor in overload_factors:
        rate = round(factor * reference, 3)
        overload[f"{factor:g}"] = at_factor = {"rate": rate}
        for mode, mode_results in results.items():
            at_overload = simulate_rate(mode, rate, window_s, seeds, base, gpu, words)
            peak = max(peak_goodput(mode_results), at_overload.goodput)
            at_factor[mode] = {
                "result": at_overload.to_dict(),
                "peak_goodput": peak,
                "goodput_share_of_peak": at_overload.goodput / peak if peak else 0.0,
                "goodput_share_of_capacity": at_overload.goodput / reference if reference else 0.0,
            }
    return {
        "window_s": window_s,
        "max_words": max_words,
        "seeds": list(seeds),
        "rates": list(rates),
        "reference_mode": reference_mode,
        "reference_capacity": reference,
        "capacity_90": capacities,
        "capacity_99": {m: capacity(r, 0.99) for m, r in results.items()},
        "overload": overload,
        "results": {m: [r.to_dict() for r in rs] for m, rs in results.items()},
    }
