"""Our server's modes side by side in one run (paper §4.7), so every capacity comes with its baselines."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from benchmarks.capacity_search import SearchConfig, SearchResult, run_search
from benchmarks.modes import ModeSwitcher, ModeSwitchError
from benchmarks.sweep import SweepConfig, SweepResult, run_sweep

# Mode names the server is expected to offer at GET /voxserve/modes, from the baseline up.
ABLATION_MODES = {
    "vllm-stock": "vLLM's stock scheduler, codec run inline after each step",
    "time-sharing": "synchronous loop time-sharing the GPU between backbone and codec",
    "two-stream": "synchronous loop, codec on a second stream",
    "async-lanes": "asynchronous LM and codec lanes with slack-based codec batching",
    "split-urgent": "SM split between backbone and codec, plus the full-GPU urgent lane",
    "voxserve": "all of the above plus deadline-aware prefill admission",
}
DEFAULT_MODES = tuple(ABLATION_MODES)


@dataclass(frozen=True, slots=True)
class AblationConfig:
    modes: tuple[str, ...] = DEFAULT_MODES
    sweep: SweepConfig | None = None  # exactly one of sweep / search says how each mode is measured
    search: SearchConfig | None = None
    # Search only: start each mode's bracket at the previous mode's capacity (modes listed weakest first).
    chain_start: bool = False
    # Search only: a mode's own first rate, over the chained one (a known bracket need not be found again).
    start_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.sweep is None) == (self.search is None):
            raise ValueError("give exactly one of sweep or search")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes must be non-empty and distinct, got {self.modes}")
        if not set(self.start_rates) <= set(self.modes):
            raise ValueError(f"start rates for modes not measured: {sorted(set(self.start_rates) - set(self.modes))}")

    @property
    def load(self):
        return self.sweep.load if self.sweep is not None else self.search.load


def run_ablation(config: AblationConfig, switcher: ModeSwitcher,
                 on_update: Callable[[dict[str, SweepResult | SearchResult]], None] | None = None,
                 switch_errors: dict[str, str] | None = None,
                 ) -> tuple[dict[str, SweepResult | SearchResult], dict[str, float]]:
    """Measure each mode in turn on the same server (and client); returns results and switch times per mode.

    `on_update` sees all results so far after every rate of every mode (for partial saves). A mode the server
    refuses to switch to is skipped, its error kept in `switch_errors` (the other modes still run; with none
    given, the error ends the run).
    """
    results: dict[str, SweepResult | SearchResult] = {}
    switch_s: dict[str, float] = {}
    try:
        for mode in config.modes:
            start = time.monotonic()
            try:
                switcher.switch(mode)
            except ModeSwitchError as exc:
                if switch_errors is None:
                    raise
                switch_errors[mode] = str(exc)
                print(f"mode {mode}: skipped: {exc}", file=sys.stderr, flush=True)
                continue
            switch_s[mode] = time.monotonic() - start
            if config.load.progress:
                print(f"mode {mode}: ready after {switch_s[mode]:.1f} s", file=sys.stderr, flush=True)
            # Each mode gets its own warm-up burst: a switch can leave cold graphs or queues behind.
            def update(result, mode=mode):
                results[mode] = result
                if on_update is not None:
                    on_update(results)

            if config.sweep is not None:
                results[mode] = run_sweep(config.sweep, on_update=update)
            else:
                results[mode] = run_search(_search_for(config, results, mode), on_update=update)
    finally:
        switcher.close()
    return results, switch_s


def _search_for(config: AblationConfig, done: dict[str, SweepResult | SearchResult], mode: str) -> SearchConfig:
    search = config.search
    if mode in config.start_rates:
        return dataclasses.replace(search, start_rate=config.start_rates[mode])
    if not config.chain_start or not done:
        return search
    lowest = min(search.thresholds)
    previous = list(done.values())[-1]
    capacity = previous.capacity.get(f"{lowest:.2f}")
    if capacity is None:  # not settled (its budget ran out): the highest rate it met, a lower bound
        met = [s.rate for s in previous.summaries if s.attainment >= lowest]
        if not met:
            return search
        capacity = max(met)
    start = min(max(capacity, search.resolution), search.max_rate)
    return dataclasses.replace(search, start_rate=start)
