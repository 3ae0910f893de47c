"""SLO-capacity search: bracket the rate by doubling up from the start rate (or, when the start already misses, by
stepping down from it in growing steps), then bisect, with shorter windows than a full sweep.

It assumes attainment falls as the rate rises; a full sweep checks every rate and is the reference. Rates are
probed on a grid of `resolution` req/s, and each probe pools all seeds like a sweep's rate does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from benchmarks.metrics import RateSummary
from benchmarks.sweep import LoadConfig, LoadGenerator, Run, _log, format_rate_line, open_session

MIN_SEARCH_WINDOW_S = 20.0


@dataclass(frozen=True, slots=True)
class SearchConfig:
    load: LoadConfig  # load.window_s is the (shorter) window of every probe
    start_rate: float = 8.0
    resolution: float = 2.0
    max_rate: float = 256.0
    thresholds: tuple[float, ...] = (0.99, 0.90)
    allow_short_window: bool = False  # tests only: windows under 20 s say little about a real server
    settle_early: bool = True  # end a probe once it is sure to miss the lowest threshold (saves device time)

    def __post_init__(self) -> None:
        if self.load.window_s < MIN_SEARCH_WINDOW_S and not self.allow_short_window:
            raise ValueError(f"search windows must be >= {MIN_SEARCH_WINDOW_S} s, got {self.load.window_s}")
        if self.resolution <= 0 or self.start_rate < self.resolution or self.max_rate < self.start_rate:
            raise ValueError("need 0 < resolution <= start_rate <= max_rate")
        if not self.thresholds or not all(0 < t <= 1 for t in self.thresholds):
            raise ValueError(f"thresholds must be in (0, 1], got {self.thresholds}")


def _on_grid(rate: float, resolution: float) -> float:
    return round(round(rate / resolution) * resolution, 6)


def _bracket_from(known: dict[float, float], threshold: float) -> tuple[float, float | None]:
    """(highest passing rate below every failure, lowest failing rate) among the rates probed so far."""
    failing = [r for r, a in known.items() if a < threshold]
    hi = min(failing) if failing else None
    passing = [r for r, a in known.items() if a >= threshold and (hi is None or r < hi)]
    return max(passing, default=0.0), hi


async def search_capacity(evaluate: Callable[[float], Awaitable[float]], threshold: float, start_rate: float,
                          resolution: float, max_rate: float, known: dict[float, float]) -> float:
    """Highest grid rate with attainment >= threshold (0.0 if even the lowest probe misses).

    `evaluate(rate)` returns the attainment at `rate`; `known` caches rate -> attainment across calls and thresholds.
    If no probe up to `max_rate` misses, the result is the highest rate probed.
    """

    async def probe(rate: float) -> bool:
        if rate not in known:
            known[rate] = await evaluate(rate)
        return known[rate] >= threshold

    lo, hi = _bracket_from(known, threshold)
    if hi is None:
        rate = _on_grid(start_rate, resolution) if lo == 0 else _on_grid(2 * lo, resolution)
        while rate <= max_rate:
            if not await probe(rate):
                hi = rate
                break
            lo, rate = rate, _on_grid(2 * rate, resolution)
        else:  # doubling overshot max_rate without a miss: try max_rate itself
            top = _on_grid(max_rate, resolution)
            if lo >= top or await probe(top):
                return max(lo, top)
            hi = top
    if lo == 0:  # the start missed: step down from it (1, 2, 4 ... grid steps), since a start is usually a guess
        # near capacity (the last run's, or the previous mode's): halving from it cost run 2026-12-02_f0a91d7 its budget
        step = resolution
        while hi - step >= resolution - 1e-9:
            rate = _on_grid(hi - step, resolution)
            if await probe(rate):
                lo = rate
                break
            hi, step = rate, 2 * step
    while hi - lo > resolution + 1e-9:
        mid = _on_grid((lo + hi) / 2, resolution)
        if mid <= lo or mid >= hi:
            break
        if await probe(mid):
            lo = mid
        else:
            hi = mid
    return lo


class BudgetExhausted(Exception):
    pass


@dataclass(slots=True)
class SearchResult:
    window_s: float
    stop_reason: str = ""  # empty when every threshold's search finished
    runs: list[Run] = field(default_factory=list)
    summaries: list[RateSummary] = field(default_factory=list)  # in probe order
    capacity: dict[str, float] = field(default_factory=dict)  # threshold ("0.90") -> req/s

    def sorted_summaries(self) -> list[RateSummary]:
        return sorted(self.summaries, key=lambda s: s.rate)


async def search_async(config: SearchConfig, warm_up: bool = True,
                       on_update: Callable[[SearchResult], None] | None = None) -> SearchResult:
    """Capacity per threshold (highest first, reusing probes). `on_update` sees the result after each probe."""
    result = SearchResult(window_s=config.load.window_s)
    async with open_session() as session:
        generator = LoadGenerator(config.load, session)
        if warm_up:
            await generator.warm_up()

        async def evaluate(rate: float) -> float:
            if not generator.fits_budget():
                raise BudgetExhausted(f"time budget of {config.load.time_budget_s:g} s reached before {rate:g} req/s")
            settle = min(config.thresholds) if config.settle_early else None
            runs, summary = await generator.measure(rate, settle_below=settle)
            result.runs.extend(runs)
            result.summaries.append(summary)
            _log("probe " + format_rate_line(summary))
            if on_update is not None:
                on_update(result)
            return summary.attainment

        known: dict[float, float] = {}
        try:
            for threshold in sorted(config.thresholds, reverse=True):
                capacity = await search_capacity(evaluate, threshold, config.start_rate, config.resolution,
                                                 config.max_rate, known)
                result.capacity[f"{threshold:.2f}"] = capacity
                if on_update is not None:  # a threshold can settle on known probes, with no probe to report it
                    on_update(result)
        except BudgetExhausted as exc:
            result.stop_reason = str(exc)  # thresholds without an entry in `capacity` were not settled
    return result


def run_search(config: SearchConfig, warm_up: bool = True,
               on_update: Callable[[SearchResult], None] | None = None) -> SearchResult:
    return asyncio.run(search_async(config, warm_up, on_update))
