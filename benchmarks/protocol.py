"""The measurement protocol's figures for one sweep (one server start, one mode), recomputed from its requests.

Per offered rate, over its seeds: attainment pooled and per seed, p99 TTFA of admitted requests, goodput, shares
refused and failed, stalls, attainment of the requests arriving in the first and in the last third of each window
(a queue that grows during a window shows as a lower last third), refusals by where they were decided, and admitted
requests whose first audio came late by the second they were sent in. Over the rates: capacity at each threshold (the
highest rate whose attainment, and every lower probed rate's, meets it; a lower bound when the highest probed rate
still meets it) and goodput at multiples of the 99 % capacity. Pure functions on record dictionaries.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.metrics import (
    COMPLETED, REJECTED, RateSummary, SloSpec, Timeline, meets_slo, percentile, slo_capacity, summarize_rate, ttfa_s,
)
from benchmarks.record import request_timeline

THRESHOLDS = (0.90, 0.99)
# Where this plugin's server decided a refusal and for what, told by its answer's wording (first match): refusals at
# arrival are to be answered within 50 ms, a request held while its first audio could still come in time is shed
# later; an in-progress limit cut by a burst and slow to grow back refuses what the server would serve on time
# (2026-12-07_ed47d1f), the load's frames or a predicted first audio refuse for the load itself.
REFUSAL_SOURCES = (("API server at arrival: its limit", "at this API server, the most"),
                   ("API server at arrival: the engine's limit", "at this API server, as many as when the"),
                   ("engine core, held then shed", "could not start audio within"),
                   ("engine core at arrival: its limit", "requests in progress, the most it has lately kept"),
                   ("engine core at arrival: the load", "server at capacity"))
OTHER_REFUSAL = "other"
GOODPUT_MULTIPLES = (1.5, 2.0)
STABLE_POINTS = 1.0  # last third's attainment within this many points of the first third's
# The load client paused: a request went out this much after its schedule. Its sends and its reading of the streams
# stop together, so a first audio awaited across the pause reaches the client late by it, whatever the server did.
CLIENT_PAUSE_S = 0.02


@dataclass(frozen=True, slots=True)
class RefusalTimes:
    """The refusals one place decided at one rate: how many, and the time from sending each to the end of its answer."""
    source: str
    count: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None


@dataclass(frozen=True, slots=True)
class LateFirstAudio:
    """The admitted requests of one rate whose first audio came after T: how many, how late, and how they bunched
    in time (by the second of its window each was sent in). Many in few seconds point at episodes the admission let
    through (a burst of arrivals, a limit regrowing), a few in each of many seconds at a steady bias."""
    count: int
    ttfa_p50_s: float | None
    ttfa_max_s: float | None
    seconds: int  # seconds of the windows (each seed's counted apart) in which any was sent
    most_in_one_second: int
    while_client_paused: int = 0  # awaited their first audio across a pause of the client (`CLIENT_PAUSE_S`)


@dataclass(frozen=True, slots=True)
class RateRow:
    rate: float
    seeds: tuple[int, ...]
    pooled: RateSummary  # all seeds' requests; TTFA percentiles are over requests that got audio (none refused)
    attainment_per_seed: tuple[float, ...]
    refused_share: float  # answered 429/503
    refusal_p99_s: float | None  # p99 time from sending a refused request to the end of its answer
    failed_share: float  # failed, timed out or cancelled
    first_third: float | None  # attainment of requests scheduled in the first third of their window
    last_third: float | None
    refusals_by_source: tuple[RefusalTimes, ...] = ()
    late_first_audio: LateFirstAudio | None = None  # None: no admitted request's first audio came after T

    @property
    def third_drift_points(self) -> float | None:
        """Last third's attainment minus the first third's, in percentage points."""
        if self.first_third is None or self.last_third is None:
            return None
        return 100 * (self.last_third - self.first_third)

    def to_json(self) -> dict[str, Any]:
        s = self.pooled
        return {"rate": self.rate, "seeds": list(self.seeds), "num_requests": s.num_requests,
                "attainment": s.attainment, "attainment_per_seed": list(self.attainment_per_seed),
                "ttfa_p50_admitted_s": s.ttfa_p50_s, "ttfa_p99_admitted_s": s.ttfa_p99_s, "goodput": s.goodput,
                "refused_share": self.refused_share, "refusal_p99_s": self.refusal_p99_s,
                "failed_share": self.failed_share,
                "num_stalled": s.num_stalled, "first_third_attainment": self.first_third,
                "last_third_attainment": self.last_third, "third_drift_points": self.third_drift_points,
                "cut_short": s.cut_short,
                "refusals_by_source": [dataclasses.asdict(r) for r in self.refusals_by_source],
                "late_first_audio": dataclasses.asdict(self.late_first_audio) if self.late_first_audio else None}


@dataclass(frozen=True, slots=True)
class Capacity:
    rate: float  # 0.0: the lowest probed rate already misses
    lower_bound: bool  # the highest probed rate still meets the threshold: capacity is at least `rate`
    below: float | None = None  # the lowest probed rate, when it already misses: capacity is under it, how far unknown

    def text(self) -> str:
        if self.below is not None:
            return f"< {self.below:g}"
        return f"≥ {self.rate:g}" if self.lower_bound else f"{self.rate:g}"


def held_on_every_start(capacities: Sequence[Capacity]) -> Capacity:
    """The capacity every one of several starts of the same served code held (the protocol's reproduced figure): the
    lowest; exact where a start with that rate missed just above it, a lower bound where each such start ran out of
    probed rates; under the lowest probed rate of a start that missed already there."""
    if not capacities:
        raise ValueError("no start to combine")
    belows = [c.below for c in capacities if c.below is not None]
    if belows:
        return Capacity(rate=0.0, lower_bound=False, below=min(belows))
    rate = min(c.rate for c in capacities)
    return Capacity(rate=rate, lower_bound=all(c.lower_bound for c in capacities if c.rate == rate))


@dataclass(frozen=True, slots=True)
class GoodputAt:
    multiple: float
    target_rate: float  # multiple × the 99 % capacity
    rate: float  # the probed rate nearest the target
    goodput: float
    share_of_capacity: float  # goodput / the 99 % capacity (the goal: at least 0.9)


@dataclass(frozen=True, slots=True)
class ProtocolSummary:
    label: str
    rows: tuple[RateRow, ...]
    capacity: dict[str, Capacity]  # threshold ("0.90") -> capacity
    unstable_rates: tuple[float, ...]  # rates up to the 90 % capacity whose thirds differ by more than a point
    goodput_at: tuple[GoodputAt, ...]  # multiples of the 99 % capacity that were probed

    def row_at(self, rate: float) -> RateRow | None:
        return next((row for row in self.rows if row.rate == rate), None)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label,
                "capacity": {k: dataclasses.asdict(c) for k, c in self.capacity.items()},
                "stability": {"points": STABLE_POINTS, "up_to_capacity": "0.90",
                              "unstable_rates": list(self.unstable_rates)},
                "goodput_at_capacity_multiples": [dataclasses.asdict(g) for g in self.goodput_at],
                "rates": [row.to_json() for row in self.rows]}


def _thirds(runs: Sequence[dict[str, Any]], timelines: Sequence[Sequence[Timeline]],
            slo: SloSpec) -> tuple[float | None, float | None]:
    first, last = [], []
    for run, run_timelines in zip(runs, timelines):
        for request, timeline in zip(run["requests"], run_timelines):
            place = request["scheduled_s"] / run["window_s"]
            if place < 1 / 3:
                first.append(meets_slo(timeline, slo))
            elif place >= 2 / 3:
                last.append(meets_slo(timeline, slo))
    return (sum(first) / len(first) if first else None), (sum(last) / len(last) if last else None)


def _refusals(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for run in runs for r in run["requests"]
            if r.get("outcome") == REJECTED and r.get("finished_s") is not None and r.get("sent_s") is not None]


def _answer_s(request: dict[str, Any]) -> float:
    return request["finished_s"] - request["sent_s"]


def refusal_source(error: str | None) -> str:
    """Which part of the server refused a request, from the message it answered with (`REFUSAL_SOURCES`)."""
    return next((source for source, words in REFUSAL_SOURCES if words in (error or "")), OTHER_REFUSAL)


def refusals_by_source(refused: Sequence[dict[str, Any]]) -> tuple[RefusalTimes, ...]:
    """Refused requests grouped by where they were decided, in `REFUSAL_SOURCES` order, then any other."""
    times: dict[str, list[float]] = defaultdict(list)
    for request in refused:
        times[refusal_source(request.get("error"))].append(_answer_s(request))
    order = [source for source, _ in REFUSAL_SOURCES] + [OTHER_REFUSAL]
    return tuple(RefusalTimes(source, len(times[source]), percentile(times[source], 50),
                              percentile(times[source], 90), percentile(times[source], 99))
                 for source in order if times.get(source))


def late_first_audio(runs: Sequence[dict[str, Any]], timelines: Sequence[Sequence[Timeline]],
                     slo: SloSpec) -> LateFirstAudio | None:
    """Completed requests whose first audio came after the SLO's target, with the seconds they were sent in and how
    many awaited it across a pause of the client."""
    late: list[float] = []
    per_second: dict[tuple[int, int], int] = defaultdict(int)
    while_client_paused = 0
    for run, run_timelines in zip(runs, timelines):
        pauses = client_pauses(run)
        for timeline in run_timelines:
            first = ttfa_s(timeline) if timeline.outcome == COMPLETED else None
            if first is not None and first > slo.ttfa_target_s:
                late.append(first)
                per_second[(run["seed"], int(timeline.sent_s))] += 1
                end = timeline.sent_s + first
                while_client_paused += any(start < end and stop > timeline.sent_s for start, stop in pauses)
    if not late:
        return None
    return LateFirstAudio(len(late), percentile(late, 50), max(late), len(per_second), max(per_second.values()),
                          while_client_paused)


def client_pauses(run: dict[str, Any]) -> list[tuple[float, float]]:
    """Intervals of the run's clock in which the load client was paused: from a request's scheduled time to its
    sending, where that took `CLIENT_PAUSE_S` or more."""
    return [(r["scheduled_s"], r["sent_s"]) for r in run["requests"]
            if r.get("sent_s") is not None and r["sent_s"] - r["scheduled_s"] >= CLIENT_PAUSE_S]


def rate_row(rate: float, runs: Sequence[dict[str, Any]], slo: SloSpec) -> RateRow:
    """One rate's figures from its runs (one per seed)."""
    timelines = [[request_timeline(request) for request in run["requests"]] for run in runs]
    per_seed = [summarize_rate(rate, run["window_s"], run_timelines, slo)
                for run, run_timelines in zip(runs, timelines)]
    pooled_timelines = [t for run_timelines in timelines for t in run_timelines]
    pooled = summarize_rate(rate, sum(run["window_s"] for run in runs), pooled_timelines, slo)
    pooled = dataclasses.replace(pooled, cut_short=any(run.get("settled_early") for run in runs))
    n = pooled.num_requests or 1
    first, last = _thirds(runs, timelines, slo)
    refused = _refusals(runs)
    return RateRow(rate=rate, seeds=tuple(run["seed"] for run in runs), pooled=pooled,
                   attainment_per_seed=tuple(s.attainment for s in per_seed),
                   refused_share=sum(t.outcome == REJECTED for t in pooled_timelines) / n,
                   refusal_p99_s=percentile([_answer_s(r) for r in refused], 99),
                   failed_share=pooled.num_failed / n, first_third=first, last_third=last,
                   refusals_by_source=refusals_by_source(refused),
                   late_first_audio=late_first_audio(runs, timelines, slo))


def rate_rows(runs: Sequence[dict[str, Any]], slo: SloSpec) -> list[RateRow]:
    by_rate: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if any(other["seed"] == run["seed"] for other in by_rate[float(run["rate"])]):
            raise ValueError(f"two runs of {run['rate']:g} req/s with seed {run['seed']}")
        by_rate[float(run["rate"])].append(run)
    return [rate_row(rate, sorted(by_rate[rate], key=lambda r: r["seed"]), slo) for rate in sorted(by_rate)]


def capacity_of(rows: Sequence[RateRow], threshold: float) -> Capacity:
    rate = slo_capacity({row.rate: row.pooled.attainment for row in rows}, threshold)
    below = rows[0].rate if rows and rate == 0 else None
    return Capacity(rate=rate, lower_bound=bool(rows) and rate == rows[-1].rate, below=below)


def unstable_rates(rows: Sequence[RateRow], up_to: float) -> tuple[float, ...]:
    """Rates up to `up_to` whose last third's attainment differs from the first third's by more than a point."""
    return tuple(row.rate for row in rows if row.rate <= up_to and row.third_drift_points is not None
                 and abs(row.third_drift_points) > STABLE_POINTS + 1e-9)


def goodput_at_multiples(rows: Sequence[RateRow], capacity: float,
                         multiples: Sequence[float] = GOODPUT_MULTIPLES) -> tuple[GoodputAt, ...]:
    """Goodput at each multiple of `capacity` that was probed: at the probed rate nearest the target, when it lies
    within half the rate step of it."""
    if capacity <= 0 or len(rows) < 2:
        return ()
    rates = [row.rate for row in rows]
    step = min(b - a for a, b in zip(rates, rates[1:]))
    found = []
    for multiple in multiples:
        target = multiple * capacity
        nearest = min(rows, key=lambda row: (abs(row.rate - target), -row.rate))  # a tie: the higher
        if abs(nearest.rate - target) <= step / 2 + 1e-9:
            found.append(GoodputAt(multiple, target, nearest.rate, nearest.pooled.goodput,
                                   nearest.pooled.goodput / capacity))
    return tuple(found)


def summarize_protocol(label: str, runs: Sequence[dict[str, Any]], slo: SloSpec,
                       thresholds: Sequence[float] = THRESHOLDS) -> ProtocolSummary:
    rows = rate_rows(runs, slo)
    capacity = {f"{th:.2f}": capacity_of(rows, th) for th in thresholds}
    stable_to = capacity.get("0.90", Capacity(0.0, False)).rate
    top = capacity.get("0.99")
    return ProtocolSummary(label=label, rows=tuple(rows), capacity=capacity,
                           unstable_rates=unstable_rates(rows, stable_to),
                           goodput_at=goodput_at_multiples(rows, top.rate) if top else ())
