"""Streaming-speech metrics on recorded request timelines (paper §2.2 and appendix "Metrics").

Pure functions: no HTTP, no clock. Times are seconds on one monotonic clock; audio amounts are seconds of audio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Outcomes a request can end with. Only "completed" can meet the SLO.
COMPLETED = "completed"
REJECTED = "rejected"  # the server refused it (HTTP 429/503)
FAILED = "failed"  # any other HTTP error, a broken stream, or a stream without audio
TIMED_OUT = "timed_out"  # still running when the client gave up
CANCELLED = "cancelled"  # stopped (or never sent) once a capacity probe was sure to miss its threshold
OUTCOMES = (COMPLETED, REJECTED, FAILED, TIMED_OUT, CANCELLED)


@dataclass(frozen=True, slots=True)
class SloSpec:
    ttfa_target_s: float = 0.200
    stall_threshold_s: float = 0.010  # a request stalls if its playback pauses add up to at least this

    def __post_init__(self) -> None:
        if not self.ttfa_target_s > 0:
            raise ValueError(f"ttfa_target_s must be > 0, got {self.ttfa_target_s}")
        if not self.stall_threshold_s > 0:
            raise ValueError(f"stall_threshold_s must be > 0, got {self.stall_threshold_s}")


@dataclass(frozen=True, slots=True)
class Timeline:
    """What the client saw of one request.

    `chunk_times_s[i]` is when network chunk i arrived and `chunk_audio_s[i]` how much audio (header bytes excluded)
    it carried; chunks with no audio (a lone WAV header) have 0. `chunk_text_ready_s[i]`, for text sent in pieces,
    is when all the text chunk i speaks had been sent (`text_ready_times`); empty: all of it came with the request.
    """

    sent_s: float
    outcome: str
    chunk_times_s: tuple[float, ...] = ()
    chunk_audio_s: tuple[float, ...] = ()
    chunk_text_ready_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if len(self.chunk_times_s) != len(self.chunk_audio_s):
            raise ValueError("chunk_times_s and chunk_audio_s differ in length")
        if any(b < a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:])):
            raise ValueError("chunk_times_s must be non-decreasing")
        if any(d < 0 for d in self.chunk_audio_s):
            raise ValueError("chunk_audio_s must be >= 0")
        if self.chunk_text_ready_s and len(self.chunk_text_ready_s) != len(self.chunk_times_s):
            raise ValueError("chunk_text_ready_s must be empty or as long as chunk_times_s")


def _audio_chunks(timeline: Timeline) -> list[tuple[float, float]]:
    return [(t, d) for t, d in zip(timeline.chunk_times_s, timeline.chunk_audio_s) if d > 0]


def ttfa_s(timeline: Timeline) -> float | None:
    """Time from sending the request to the first audio bytes; None if no audio arrived."""
    audio = _audio_chunks(timeline)
    return audio[0][0] - timeline.sent_s if audio else None


def audio_duration_s(timeline: Timeline) -> float:
    return sum(timeline.chunk_audio_s)


def playback_pause_s(timeline: Timeline) -> float:
    """Total pause of a player that starts at the first audio and waits whenever its buffer runs dry, counting only
    the server's share of each pause.

    The player's buffer runs out at `buffer_end`; a chunk arriving later than that pauses playback until it arrives
    (Eq. 2 of the paper, with the pauses so far pushing later deadlines back, as a real player does). With text sent
    in pieces, the part of a pause before the chunk's text was all sent is the client's (the server had nothing to
    speak yet): only the part after max(buffer_end, text ready) counts.
    """
    ready = timeline.chunk_text_ready_s or (-math.inf,) * len(timeline.chunk_times_s)
    audio = [(t, d, r) for t, d, r in zip(timeline.chunk_times_s, timeline.chunk_audio_s, ready) if d > 0]
    if not audio:
        return 0.0
    first_t, first_d, _ = audio[0]
    buffer_end = first_t + first_d
    paused = 0.0
    for arrival, duration, text_ready in audio[1:]:
        if arrival > buffer_end:
            paused += arrival - max(buffer_end, text_ready)
            buffer_end = arrival
        buffer_end += duration
    return paused


def text_ready_times(chunk_audio_s: Sequence[float], word_sent_s: Sequence[float], end_sent_s: float | None,
                     lookahead_words: int = 0) -> tuple[float, ...]:
    """When the text each chunk speaks had all been sent, for text sent word by word.

    Which words a chunk speaks is not observable; they are taken as spread evenly over the audio: a chunk whose
    audio ends at fraction f of the whole needs the first ceil(f * words) words plus `lookahead_words`, and the one
    that ends the audio also needs the end of the text (`end_sent_s`, the client's `end` message).
    """
    words, total = len(word_sent_s), sum(chunk_audio_s)
    if not words or total <= 0:
        return tuple(-math.inf for _ in chunk_audio_s)
    ready, played = [], 0.0
    for duration in chunk_audio_s:
        played += duration
        needed = min(words, math.ceil(words * played / total - 1e-9) + lookahead_words)
        at = word_sent_s[needed - 1] if needed > 0 else -math.inf
        if played >= total - 1e-9 and end_sent_s is not None:
            at = max(at, end_sent_s)
        ready.append(at)
    return tuple(ready)


def stalled(timeline: Timeline, slo: SloSpec) -> bool:
    return playback_pause_s(timeline) >= slo.stall_threshold_s


def meets_slo(timeline: Timeline, slo: SloSpec) -> bool:
    """Completed, TTFA at most the target, and no stall. Rejected, failed and timed-out requests are misses."""
    if timeline.outcome != COMPLETED:
        return False
    first = ttfa_s(timeline)
    return first is not None and first <= slo.ttfa_target_s and not stalled(timeline, slo)


def attainment_percent(share: float) -> str:
    """An attainment as a percentage to one decimal, rounded down, so that a rate that missed a threshold never
    reads as meeting it (0.9899 reads 98.9, not 99.0). The tiny lift keeps shares that are exact in decimal but not
    in binary, like 0.57, from flooring a step low."""
    return f"{math.floor(share * 1000 + 1e-6) / 10:.1f}"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class RateSummary:
    """One offered rate, pooled over all its runs (seeds)."""

    rate: float
    window_s: float  # total arrival window over the pooled runs
    num_requests: int
    num_completed: int
    num_rejected: int
    num_failed: int  # failed + timed out + cancelled
    num_stalled: int  # completed requests that stalled
    num_met: int
    attainment: float
    goodput: float  # requests meeting the SLO per second of arrival window
    throughput: float  # completed requests per second of arrival window
    audio_within_1s: float  # fraction of all requests whose first audio came within 1 s (the sweep's stop rule)
    ttfa_p50_s: float | None  # TTFA percentiles over requests that received audio
    ttfa_p90_s: float | None
    ttfa_p99_s: float | None
    ttfa_mean_s: float | None
    cut_short: bool = False  # a search probe ended once sure to miss: attainment and goodput are lower bounds


def summarize_rate(rate: float, window_s: float, timelines: Sequence[Timeline], slo: SloSpec) -> RateSummary:
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    ttfas = [t for t in (ttfa_s(tl) for tl in timelines) if t is not None]
    n = len(timelines)
    met = sum(meets_slo(tl, slo) for tl in timelines)
    completed = [tl for tl in timelines if tl.outcome == COMPLETED]
    return RateSummary(
        rate=rate,
        window_s=window_s,
        num_requests=n,
        num_completed=len(completed),
        num_rejected=sum(tl.outcome == REJECTED for tl in timelines),
        num_failed=sum(tl.outcome in (FAILED, TIMED_OUT, CANCELLED) for tl in timelines),
        num_stalled=sum(stalled(tl, slo) for tl in completed),
        num_met=met,
        attainment=met / n if n else 0.0,
        goodput=met / window_s,
        throughput=len(completed) / window_s,
        audio_within_1s=sum(t <= 1.0 for t in ttfas) / n if n else 0.0,
        ttfa_p50_s=percentile(ttfas, 50),
        ttfa_p90_s=percentile(ttfas, 90),
        ttfa_p99_s=percentile(ttfas, 99),
        ttfa_mean_s=sum(ttfas) / len(ttfas) if ttfas else None,
    )


def slo_capacity(attainment_by_rate: Mapping[float, float], threshold: float) -> float:
    """Highest tested rate whose attainment, and that of every lower tested rate, is at least `threshold`.

    0.0 if the lowest tested rate already misses (or nothing was tested).
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    capacity = 0.0
    for rate in sorted(attainment_by_rate):
        if attainment_by_rate[rate] < threshold:
            break
        capacity = rate
    return capacity


def capacities(summaries: Iterable[RateSummary], thresholds: Sequence[float] = (0.90, 0.99)) -> dict[str, float]:
    """SLO capacity per threshold, keyed like "0.90"."""
    by_rate = {s.rate: s.attainment for s in summaries}
    return {f"{th:.2f}": slo_capacity(by_rate, th) for th in thresholds}
