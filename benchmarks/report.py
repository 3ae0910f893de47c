"""Results to outputs: record bodies, plots and the one-line summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.capacity_search import SearchResult
from benchmarks.metrics import RateSummary, SloSpec
from benchmarks.record import write_record
from benchmarks.sweep import SweepResult

SEARCH_METHOD = ("bracket by doubling from start_rate, then bisect to resolution; each probe pools all seeds over "
                 "window_s; assumes attainment does not rise with rate (a full sweep checks every rate); with "
                 "settle_early a probe ends once it is sure to miss the lowest threshold, its unfinished requests "
                 "recorded as cancelled, so its attainment is then a lower bound")


def result_body(result: SweepResult | SearchResult) -> dict[str, Any]:
    if isinstance(result, SweepResult):
        return {"strategy": "sweep", "stop_reason": result.stop_reason, "capacity": result.capacities(),
                "summaries": [dataclasses.asdict(s) for s in result.summaries],
                "runs": [run.to_json() for run in result.runs]}
    return {"strategy": "search", "method": SEARCH_METHOD, "window_s": result.window_s,
            "stop_reason": result.stop_reason, "capacity": result.capacity,
            "summaries": [dataclasses.asdict(s) for s in result.sorted_summaries()],
            "probe_order": [s.rate for s in result.summaries],
            "runs": [run.to_json() for run in result.runs]}


def result_summaries(result: SweepResult | SearchResult) -> list[RateSummary]:
    return result.summaries if isinstance(result, SweepResult) else result.sorted_summaries()


def result_capacity(result: SweepResult | SearchResult) -> dict[str, float]:
    return result.capacities() if isinstance(result, SweepResult) else result.capacity


def one_line(label: str, result: SweepResult | SearchResult, slo: SloSpec, seeds: Sequence[int]) -> str:
    summaries = sorted(result_summaries(result), key=lambda s: s.rate)
    if not summaries:
        return f"{label}: no rate measured"
    capacity = result_capacity(result)
    top = summaries[-1].rate

    def bound(rate: float) -> str:  # no tested rate missed: the capacity is at least the highest rate tested
        return f">={rate:g}" if rate >= top else f"{rate:g}"

    caps = ", ".join(f"{bound(capacity[k])} req/s at {float(k):.0%}" for k in sorted(capacity)) or "not settled"
    best = max(summaries, key=lambda s: s.goodput)
    window = summaries[0].window_s / len(seeds)
    at_cap = [s for s in summaries if s.rate == capacity.get("0.90")]
    p99 = (f"; p99 TTFA {at_cap[0].ttfa_p99_s * 1000:.0f} ms there" if at_cap and at_cap[0].ttfa_p99_s is not None
           else "")
    return (f"{label}: SLO capacity {caps} (TTFA <= {slo.ttfa_target_s * 1000:g} ms, no stall){p99}; peak goodput "
            f"{best.goodput:.1f} req/s at {best.rate:g} req/s; rates {summaries[0].rate:g}-{summaries[-1].rate:g}, "
            f"{len(seeds)} seed(s) x {window:g} s, {sum(s.num_requests for s in summaries)} requests"
            + (f" [{result.stop_reason}]" if "budget" in result.stop_reason else ""))


def write_outputs(record: dict[str, Any], results: dict[str, SweepResult | SearchResult], out_dir: str | Path,
                  slo: SloSpec, plots: bool = True) -> tuple[Path, list[Path]]:
    """record.json plus attainment/ttfa_p99/goodput PNGs (one line per entry of `results`) in `out_dir`."""
    out = Path(out_dir)
    json_path = write_record(record, out / "record.json")
    if not plots:
        return json_path, []
    try:  # the offline GPU host has no matplotlib: plot later with `python -m benchmarks.replot DIR`
        from benchmarks.plots import plot_series
    except ImportError:
        print(f"matplotlib missing: no plots; run `python -m benchmarks.replot {out}` elsewhere")
        return json_path, []
    series = {label: result_summaries(result) for label, result in results.items()}
    pngs = plot_series(series, out, slo.ttfa_target_s)
    return json_path, pngs
