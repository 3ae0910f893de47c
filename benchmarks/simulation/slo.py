"""Client-side view of one simulated request: TTFA, a player that stalls, SLO attainment, capacity, goodput.

Same definitions as the paper (§2.2, Appendix B): the player starts at the first audio and pauses whenever the next
audio has not arrived; a request stalls if its pauses add up to 10 ms or more; it meets the SLO if it completes, its
TTFA is at most T and it does not stall. Rejected requests count as misses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from benchmarks.metrics import slo_capacity  # noqa: F401  (the one definition; re-exported for the sweep)

STALL_THRESHOLD_S = 0.010


@dataclass(slots=True)
class RequestOutcome:
    request_id: str
    arrival_time: float
    rejected: bool = False
    completed: bool = False
    completed_at: float | None = None
    audio: list[tuple[float, float]] = field(default_factory=list)  # (arrival time, seconds of audio) per chunk

    def ttfa_s(self) -> float | None:
        return self.audio[0][0] - self.arrival_time if self.audio else None

    def pause_s(self) -> float:
        if not self.audio:
            return 0.0
        paused = 0.0
        play_end = self.audio[0][0]
        for arrived, seconds in self.audio:
            paused += max(arrived - play_end, 0.0)
            play_end = max(arrived, play_end) + seconds
        return paused

    def meets_slo(self, ttfa_target_s: float) -> bool:
        ttfa = self.ttfa_s()
        return (
            self.completed and ttfa is not None and ttfa <= ttfa_target_s and self.pause_s() < STALL_THRESHOLD_S
        )


@dataclass(slots=True)
class RateResult:
    mode: str
    rate: float
    window_s: float
    offered: int
    met: int
    completed: int
    rejected: int
    stalled: int
    ttfa_p50_ms: float | None
    ttfa_p99_ms: float | None
    prefill_deferrals: int
    completed_in_window: int = 0
    # codec batches launched on each lane and the chunks they carried ("background_batches", "urgent_chunks", ...)
    codec_batches: dict[str, int] = field(default_factory=dict)

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0

    @property
    def goodput(self) -> float:
        """Requests per second that met the SLO."""
        return self.met / self.window_s

    @property
    def throughput(self) -> float:
        """Requests per second completed within the arrival window (the paper's "completes N req/s")."""
        return self.completed_in_window / self.window_s

    def to_dict(self) -> dict:
        fields = {name: getattr(self, name) for name in self.__slots__}
        return {**fields, "attainment": self.attainment, "goodput": self.goodput, "throughput": self.throughput}


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)
    return 1000.0 * ordered[index]


def summarize(
    mode: str,
    rate: float,
    window_s: float,
    outcomes: Sequence[RequestOutcome],
    ttfa_target_s: float,
    deferrals: int,
    window_end_s: float | None = None,
    codec_batches: dict[str, int] | None = None,
) -> RateResult:
    """`window_s`: total arrival time pooled over seeds; `window_end_s`: when one seed's arrivals stop."""
    end = window_s if window_end_s is None else window_end_s
    ttfas = [t for t in (o.ttfa_s() for o in outcomes) if t is not None]
    return RateResult(
        mode=mode,
        rate=rate,
        window_s=window_s,
        offered=len(outcomes),
        met=sum(o.meets_slo(ttfa_target_s) for o in outcomes),
        completed=sum(o.completed for o in outcomes),
        rejected=sum(o.rejected for o in outcomes),
        stalled=sum(o.completed and o.pause_s() >= STALL_THRESHOLD_S for o in outcomes),
        ttfa_p50_ms=percentile_ms(ttfas, 0.50),
        ttfa_p99_ms=percentile_ms(ttfas, 0.99),
        prefill_deferrals=deferrals,
        completed_in_window=sum(o.completed and o.completed_at is not None and o.completed_at <= end for o in outcomes),
        codec_batches=dict(codec_batches or {}),
    )


