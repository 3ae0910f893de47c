"""Closed-loop load: at each concurrency level exactly C requests in flight (each one's end sends the next) until the
level's requests are done; TTFA percentiles, real-time factor and audio delivered per wall second at each level.

The figure published for other servers (vLLM-Omni's TTFA table at 1-32 concurrent requests) is measured this way;
the open-loop sweep is what the SLO capacity is measured with.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from benchmarks.client import RequestRecord, build_payload, stream_request
from benchmarks.metrics import COMPLETED, REJECTED, audio_duration_s, meets_slo, percentile, ttfa_s
from benchmarks.sweep import LoadConfig, LoadGenerator, _log, open_session
from benchmarks.workload import frames_for_text, word_count


@dataclass(frozen=True, slots=True)
class ConcurrencyConfig:
    load: LoadConfig
    levels: tuple[int, ...] = (1, 4, 8, 16, 32)
    requests_per_level: int = 64  # per level and seed

    def __post_init__(self) -> None:
        if not self.levels or any(c < 1 for c in self.levels) or len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels must be distinct and >= 1, got {self.levels}")
        if self.requests_per_level < 1:
            raise ValueError(f"requests_per_level must be >= 1, got {self.requests_per_level}")


@dataclass(slots=True)
class LevelRun:
    """One level with one seed: `requests` requests, at most (and, while enough are left, exactly) C in flight."""

    concurrency: int
    seed: int
    started_at: str
    records: list[RequestRecord]
    elapsed_s: float = 0.0  # first send to last end
    idle_wait_s: float | None = None

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "seed": self.seed, "started_at": self.started_at,
                "elapsed_s": self.elapsed_s, "idle_wait_s": self.idle_wait_s,
                "requests": [r.to_json() for r in self.records]}


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """One level, pooled over its seeds. TTFA percentiles are over requests that got audio; the real-time factor
    (time from sending to the stream's end over the audio's length) over completed ones."""

    concurrency: int
    num_requests: int
    num_completed: int
    num_rejected: int
    num_failed: int  # neither completed nor rejected
    num_met: int  # completed within the SLO (TTFA target, no stall)
    wall_s: float
    ttfa_p50_s: float | None
    ttfa_p95_s: float | None
    ttfa_p99_s: float | None
    ttfa_mean_s: float | None
    rtf_p50: float | None
    rtf_mean: float | None
    audio_s_per_wall_s: float  # seconds of audio delivered per second of wall time
    requests_per_s: float  # completed requests per second of wall time


def _rtf(record: RequestRecord) -> float | None:
    audio = audio_duration_s(record.timeline())
    if record.outcome != COMPLETED or audio <= 0 or record.finished_s is None or record.sent_s is None:
        return None
    return (record.finished_s - record.sent_s) / audio


def summarize_level(concurrency: int, runs: Sequence[LevelRun], load: LoadConfig) -> LevelSummary:
    records = [r for run in runs for r in run.records]
    timelines = [r.timeline() for r in records]
    ttfas = [t for t in map(ttfa_s, timelines) if t is not None]
    rtfs = [x for x in map(_rtf, records) if x is not None]
    completed = sum(r.outcome == COMPLETED for r in records)
    rejected = sum(r.outcome == REJECTED for r in records)
    wall = sum(run.elapsed_s for run in runs) or 1e-9
    audio = sum(audio_duration_s(t) for t, r in zip(timelines, records) if r.outcome == COMPLETED)
    return LevelSummary(
        concurrency=concurrency, num_requests=len(records), num_completed=completed, num_rejected=rejected,
        num_failed=len(records) - completed - rejected, num_met=sum(meets_slo(t, load.slo) for t in timelines),
        wall_s=wall, ttfa_p50_s=percentile(ttfas, 50), ttfa_p95_s=percentile(ttfas, 95),
        ttfa_p99_s=percentile(ttfas, 99), ttfa_mean_s=sum(ttfas) / len(ttfas) if ttfas else None,
        rtf_p50=percentile(rtfs, 50), rtf_mean=sum(rtfs) / len(rtfs) if rtfs else None,
        audio_s_per_wall_s=audio / wall, requests_per_s=completed / wall)


@dataclass(slots=True)
class ConcurrencyResult:
    runs: list[LevelRun] = field(default_factory=list)
    summaries: list[LevelSummary] = field(default_factory=list)
    stop_reason: str = ""


class ClosedLoop:
    """Sends one level's requests from C workers that each send the next request when their last one ends."""

    def __init__(self, generator: LoadGenerator):
        self.generator = generator
        self.load = generator.config

    def _new_record(self, index: int, text: str, origin: float) -> RequestRecord:
        frames = frames_for_text(text, self.load.frames_per_word) if self.load.fixed_length else None
        return RequestRecord(index=index, text=text, num_words=word_count(text), num_frames=frames,
                             scheduled_s=time.perf_counter() - origin)

    async def run(self, concurrency: int, seed: int, count: int) -> LevelRun:
        idle_wait_s = await self.generator.wait_until_idle()
        order = self.generator.orders[seed]
        texts = [order.next() for _ in range(count)]
        records: list[RequestRecord] = []
        started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        origin = time.perf_counter()

        async def worker() -> None:
            while len(records) < count:
                record = self._new_record(len(records), texts[len(records)], origin)
                records.append(record)
                payload = build_payload(self.load.profile, record.text, record.num_frames,
                                        seed * 1_000_003 + record.index)
                await stream_request(self.generator.session, self.load.url, payload, self.load.profile, record,
                                     origin, self.load.request_timeout_s)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return LevelRun(concurrency, seed, started_at, records, elapsed_s=time.perf_counter() - origin,
                        idle_wait_s=idle_wait_s)


async def concurrency_async(config: ConcurrencyConfig, warm_up: bool = True,
                            on_update: Callable[[ConcurrencyResult], None] | None = None) -> ConcurrencyResult:
    """Every level (in the order given) with every seed; `on_update` sees the result after each level."""
    result = ConcurrencyResult()
    load = config.load
    async with open_session() as session:
        generator = LoadGenerator(load, session)
        if warm_up:
            await generator.warm_up()
        loop, longest = ClosedLoop(generator), 0.0
        for level in config.levels:
            if load.time_budget_s is not None and \
                    time.perf_counter() - generator.started + longest * len(load.seeds) > load.time_budget_s:
                result.stop_reason = f"time budget of {load.time_budget_s:g} s reached before {level} concurrent"
                break
            runs = [await loop.run(level, seed, config.requests_per_level) for seed in load.seeds]
            longest = max([longest] + [run.elapsed_s for run in runs])
            result.runs.extend(runs)
            result.summaries.append(summarize_level(level, runs, load))
            _log(format_level_line(result.summaries[-1]))
            if on_update is not None:
                on_update(result)
        else:
            result.stop_reason = "all levels run"
    return result


def run_concurrency(config: ConcurrencyConfig, warm_up: bool = True,
                    on_update: Callable[[ConcurrencyResult], None] | None = None) -> ConcurrencyResult:
    return asyncio.run(concurrency_async(config, warm_up, on_update))


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.0f}"


def format_level_line(s: LevelSummary) -> str:
    rtf = "n/a" if s.rtf_mean is None else f"{s.rtf_mean:.3f}"
    return (f"{s.concurrency} concurrent: TTFA p50/p95/p99 {_ms(s.ttfa_p50_s)}/{_ms(s.ttfa_p95_s)}/"
            f"{_ms(s.ttfa_p99_s)} ms, RTF {rtf}, {s.audio_s_per_wall_s:.1f} audio s per s, "
            f"{s.requests_per_s:.2f} req/s, {s.num_completed}/{s.num_requests} completed "
            f"({s.num_rejected} rejected, {s.num_failed} failed)")
