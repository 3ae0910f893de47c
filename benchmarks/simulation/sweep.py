"""Rate sweeps of the simulated server under named policy modes, pooled over seeds as in the paper (§4.1)."""

from __future__ import annotations

from typing import Sequence

from benchmarks.simulation.server import GpuModel, SimulatedServer
from benchmarks.simulation.slo import RateResult, slo_capacity, summarize
from benchmarks.simulation.workload import load_word_counts, poisson_workload
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

MODES = {
    # the paper's baseline LM policy: admit every prefill at once, decode in arrival order
    "prefill_first": {"admission_mode": "prefill_first", "overload_mode": "off"},
    # the paper's VoxServe: deadline-aware admission and least-slack decode order, no load shedding
    "deadline_aware": {"admission_mode": "deadline_aware", "overload_mode": "off"},
    # ours: deadline-aware, plus 503 + Retry-After past capacity
    "deadline_aware_shed": {"admission_mode": "deadline_aware", "overload_mode": "reject"},
}

DRAIN_S = 120.0  # after the arrival window, let admitted requests finish (the paper's client waits up to 900 s)


def mode_config(mode: str, base: SchedulerPolicyConfig | None = None) -> SchedulerPolicyConfig:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {sorted(MODES)}")
    return (base or SchedulerPolicyConfig()).replace(**MODES[mode])


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
    outcomes, deferrals = [], 0
    for seed in seeds:
        server = SimulatedServer(cfg, gpu, seed)
        requests = poisson_workload(rate, window_s, seed, word_counts)
        outcomes += server.run(requests, window_s + DRAIN_S)
        deferrals += server.prefill_deferrals
    return summarize(mode, rate, window_s * len(seeds), outcomes, cfg.ttfa_target_s, deferrals)


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
