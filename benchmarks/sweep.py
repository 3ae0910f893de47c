"""Open-loop rate sweep: Poisson arrivals on an absolute schedule, one arrival window per rate and seed."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import aiohttp

from benchmarks.client import RequestRecord, ServerProfile, build_payload, stream_request
from benchmarks.metrics import (CANCELLED, RateSummary, SloSpec, attainment_percent, capacities, meets_slo,
                                summarize_rate)
from benchmarks.workload import (
    FRAMES_PER_WORD, PlannedRequest, TextOrder, frames_for_text, load_texts, plan_run, word_count,
)

AUDIO_WITHIN_S = 1.0  # the stop rule's first-audio bound


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What every run against a server shares: where, what to send, how long, how judged."""

    base_url: str
    profile: ServerProfile
    workload_path: str | None = None  # None: LibriTTS test-clean
    max_words: int | None = None  # keep only texts of at most this many words (a short-utterance workload)
    fixed_length: bool = False  # random-weight models: force each request's length from its word count
    frames_per_word: float = FRAMES_PER_WORD
    seeds: tuple[int, ...] = (0,)
    window_s: float = 60.0
    request_timeout_s: float = 900.0
    warmup_requests: int = 64  # one discarded concurrent burst before the first rate
    slo: SloSpec = field(default_factory=SloSpec)
    stop_fraction: float = 0.5  # stop after a rate where fewer than this fraction get audio within 1 s
    time_budget_s: float | None = None  # start no rate that would not end within this (from the client's start)
    progress: bool = True
    # Before each window, wait (at most this long) until the server's /metrics show no request running or waiting:
    # a probe cut short leaves cancelled requests draining, and the next one must not start on that backlog.
    idle_wait_max_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be http(s)://..., got {self.base_url!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"need at least one seed, all distinct, got {self.seeds}")
        if self.window_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("window_s and request_timeout_s must be > 0")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must be >= 0")
        if self.max_words is not None and self.max_words < 1:
            raise ValueError(f"max_words must be >= 1, got {self.max_words}")
        if not 0 <= self.stop_fraction <= 1:
            raise ValueError("stop_fraction must be in [0, 1]")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError("time_budget_s must be > 0")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.profile.path


@dataclass(frozen=True, slots=True)
class SweepConfig:
    load: LoadConfig
    rates: tuple[float, ...] = ()  # explicit rates; empty: start_rate, start_rate + rate_step, ... up to max_rate
    start_rate: float = 2.0
    rate_step: float = 2.0
    max_rate: float = 200.0
    # the measurement protocol's end: after the first rate whose attainment is below `failure_threshold`, this many
    # more rates, then stop (None: run every rate)
    beyond_failure: int | None = None
    failure_threshold: float = 0.99

    def __post_init__(self) -> None:
        if self.beyond_failure is not None and self.beyond_failure < 0:
            raise ValueError(f"beyond_failure must be >= 0, got {self.beyond_failure}")
        if not 0 < self.failure_threshold <= 1:
            raise ValueError(f"failure_threshold must be in (0, 1], got {self.failure_threshold}")
        if any(r <= 0 for r in self.rates) or list(self.rates) != sorted(set(self.rates)):
            raise ValueError(f"rates must be positive and strictly increasing, got {self.rates}")
        if self.start_rate <= 0 or self.rate_step <= 0 or self.max_rate < self.start_rate:
            raise ValueError("need 0 < start_rate <= max_rate and rate_step > 0")

    def rate_list(self) -> list[float]:
        if self.rates:
            return list(self.rates)
        count = int((self.max_rate - self.start_rate) / self.rate_step + 1e-9) + 1
        return [round(self.start_rate + i * self.rate_step, 6) for i in range(count)]


@dataclass(slots=True)
class Run:
    """One arrival window at one rate with one seed."""

    rate: float
    seed: int
    window_s: float
    started_at: str
    records: list[RequestRecord]
    elapsed_s: float = 0.0  # window plus drain
    settled_early: bool = False  # a search probe stopped once sure to miss (see LoadGenerator.measure)
    idle_wait_s: float | None = None  # waited before the window for an idle server; None: no gauges to read
    client_gc_longest_s: float = 0.0  # this client's longest garbage collection during the window and its drain

    def to_json(self) -> dict:
        lags = [r.sent_s - r.scheduled_s for r in self.records if r.sent_s is not None]
        return {"rate": self.rate, "seed": self.seed, "window_s": self.window_s, "started_at": self.started_at,
                "elapsed_s": self.elapsed_s, "max_send_lag_s": max(lags, default=0.0),
                "client_gc_longest_s": self.client_gc_longest_s,
                "settled_early": self.settled_early, "idle_wait_s": self.idle_wait_s,
                "requests": [r.to_json() for r in self.records]}


class _WindowCollections:
    """For one window: the records of earlier windows frozen out of Python's garbage collector, and the longest
    collection that still ran. The client is one event loop: a pause of it stops its sends and its reading of every
    stream, so the server's first audio looks late by the pause. A sweep keeps every request it sent, and a full
    collection walks them all: in run 2026-12-07_d42ee1e sends went out up to 56 ms after their schedule at 72 req/s
    (11,000 requests kept) and up to 159 ms at 120 (64,000), growing with their number as such a collection would.
    Frozen, they are not walked; the longest collection is kept beside the window's record to tell."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._started: float | None = None

    def __enter__(self) -> _WindowCollections:
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_collection)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def _on_collection(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.longest_s = max(self.longest_s, time.perf_counter() - self._started)
            self._started = None


@dataclass(slots=True)
class SweepResult:
    runs: list[Run] = field(default_factory=list)
    summaries: list[RateSummary] = field(default_factory=list)
    stop_reason: str = ""

    def capacities(self, thresholds=(0.90, 0.99)) -> dict[str, float]:
        return capacities(self.summaries, thresholds)


class _MissCounter:
    """Whether one rate's requests already include so many certain misses that its attainment is below a bound."""

    def __init__(self, slo: SloSpec, total: int, settle_below: float | None):
        self.slo = slo
        self.limit = None if settle_below is None else (1 - settle_below) * total  # misses beyond this settle it
        self.records: list[RequestRecord] = []  # not yet finished when last looked at
        self.is_settled = False
        self._finished_misses = 0
        self._next_check = 0.0

    def settled(self, origin: float) -> bool:
        if self.limit is None or self.is_settled:
            return self.is_settled
        now = time.perf_counter()
        if now < self._next_check:
            return False
        self._next_check = now + 0.2
        open_misses, still_open = 0, []
        for r in self.records:
            if r.outcome is not None:
                self._finished_misses += not meets_slo(r.timeline(), self.slo)
                continue
            still_open.append(r)
            if r.sent_s is not None and not any(r.chunk_audio_bytes):
                # No audio yet, past the target: a miss whatever comes next (only this window is in flight).
                open_misses += now - origin - r.sent_s > self.slo.ttfa_target_s
        self.records = still_open
        self.is_settled = self._finished_misses + open_misses > self.limit
        return self.is_settled


_IN_SERVER = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def requests_in_server(metrics_text: str) -> int | None:
    """Requests running plus waiting from a Prometheus text page (summed over labels), or None without the gauges."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _IN_SERVER:
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return round(total) if seen else None


class LoadGenerator:
    """Holds the HTTP session and each seed's text order across the rates of one sweep or search."""

    def __init__(self, config: LoadConfig, session: aiohttp.ClientSession):
        self.config = config
        self.session = session
        texts = load_texts(config.workload_path, config.max_words)
        self.texts = texts
        self.orders = {seed: TextOrder(texts, seed) for seed in config.seeds}
        self.started = time.perf_counter()
        self._longest_run_s = 0.0  # window plus drain, the longest seen so far

    def fits_budget(self, window_s: float | None = None) -> bool:
        """Whether one more rate (every seed's window plus drain, judged by the longest run so far) fits."""
        if self.config.time_budget_s is None:
            return True
        per_run = max(window_s or self.config.window_s, self._longest_run_s)
        needed = per_run * len(self.config.seeds)
        return time.perf_counter() - self.started + needed <= self.config.time_budget_s

    async def warm_up(self) -> None:
        """A discarded burst of concurrent requests (graph warm-up, connection pool, allocator)."""
        count = self.config.warmup_requests
        if count == 0:
            return
        order = TextOrder(self.texts, "warmup")
        origin = time.perf_counter()
        texts = [order.next() for _ in range(count)]
        records = [self._record(i, 0.0, text, self._frames(text)) for i, text in enumerate(texts)]
        await asyncio.gather(*(self._send(r, origin, i) for i, r in enumerate(records)))
        _log(f"warm-up: {sum(r.outcome == 'completed' for r in records)}/{count} completed", self.config.progress)

    async def measure(self, rate: float, window_s: float | None = None,
                      settle_below: float | None = None) -> tuple[list[Run], RateSummary]:
        """Every seed's window at `rate`, back to back; the summary pools them.

        With `settle_below`, the rate ends as soon as its pooled attainment is sure to be below that threshold;
        requests still running or not yet sent are then recorded as cancelled (misses). A search needs no more.
        """
        cfg = self.config
        window_s = window_s or cfg.window_s
        plans = {seed: plan_run(rate, window_s, seed, self.orders[seed], cfg.fixed_length, cfg.frames_per_word)
                 for seed in cfg.seeds}
        verdict = _MissCounter(cfg.slo, sum(map(len, plans.values())), settle_below)
        runs = [await self._run_window(rate, seed, window_s, plans[seed], verdict) for seed in cfg.seeds]
        self._longest_run_s = max([self._longest_run_s] + [run.elapsed_s for run in runs])
        timelines = [r.timeline() for run in runs for r in run.records]
        summary = summarize_rate(rate, window_s * len(runs), timelines, cfg.slo)
        return runs, dataclasses.replace(summary, cut_short=verdict.is_settled)

    async def wait_until_idle(self) -> float | None:
        """Seconds waited until the server's /metrics show no request running or waiting (vLLM's gauges), at most
        `idle_wait_max_s`; None where the server exposes no such gauges."""
        started = time.perf_counter()
        url = self.config.base_url.rstrip("/") + "/metrics"
        while True:
            try:
                async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
                    busy = requests_in_server(await response.text()) if response.status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError):
                busy = None
            waited = time.perf_counter() - started
            if busy is None:
                return None
            if busy == 0 or waited >= self.config.idle_wait_max_s:
                return waited
            await asyncio.sleep(0.5)

    async def _run_window(self, rate: float, seed: int, window_s: float, planned: list[PlannedRequest],
                          verdict: _MissCounter) -> Run:
        idle_wait_s = await self.wait_until_idle() if not verdict.is_settled else None
        records = [self._record(p.index, p.offset_s, p.text, p.num_frames) for p in planned]
        verdict.records.extend(records)
        # to the millisecond: started_at plus a request's sent_s places it among the server log's lines
        started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with _WindowCollections() as collections:
            elapsed_s = await self._send_window(rate, seed, planned, records, verdict)
        return Run(rate, seed, window_s, started_at, records, elapsed_s=elapsed_s, settled_early=verdict.is_settled,
                   idle_wait_s=idle_wait_s, client_gc_longest_s=collections.longest_s)

    async def _send_window(self, rate: float, seed: int, planned: list[PlannedRequest],
                           records: list[RequestRecord], verdict: _MissCounter) -> float:
        """Every planned request sent on its schedule and followed to its end (or cut once the verdict settles);
        seconds from the schedule's origin to the last end."""
        bar = _progress_bar(len(planned), f"{rate:g} req/s seed {seed}", self.config.progress)
        origin = time.perf_counter() + 0.05  # a little lead so the first arrival is on time
        tasks = []
        for plan, record in zip(planned, records):
            if verdict.settled(origin):
                break
            # Absolute schedule: a slow server never delays later arrivals.
            delay = origin + plan.offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._send(record, origin, plan.seed))
            if bar is not None:
                task.add_done_callback(lambda _t: bar.update(1))
            tasks.append(task)
        pending = set(tasks)
        while pending:
            _done, pending = await asyncio.wait(pending, timeout=0.25)
            if pending and verdict.settled(origin):
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        for record in records:
            if record.outcome is None:
                record.outcome = CANCELLED
        if bar is not None:
            bar.close()
        return time.perf_counter() - origin

    def _frames(self, text: str) -> int | None:
        return frames_for_text(text, self.config.frames_per_word) if self.config.fixed_length else None

    def _record(self, index: int, offset_s: float, text: str, num_frames: int | None) -> RequestRecord:
        return RequestRecord(index=index, text=text, num_words=word_count(text), num_frames=num_frames,
                             scheduled_s=offset_s)

    async def _send(self, record: RequestRecord, origin: float, seed: int) -> RequestRecord:
        payload = build_payload(self.config.profile, record.text, record.num_frames, seed)
        return await stream_request(self.session, self.config.url, payload, self.config.profile, record, origin,
                                    self.config.request_timeout_s)


def open_session() -> aiohttp.ClientSession:
    # No connection cap: an open-loop client must not queue requests on its own side. Idle connections are dropped
    # after 2 s, before the server's keep-alive (uvicorn's 5 s, vLLM's default) ends them: a request sent on a
    # connection the server is closing fails as ServerDisconnectedError without reaching it (the likely cause of the
    # one such failure among run 2026-11-30_5a7f644's 23,822 requests on the H200, which the server never logged).
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))


async def sweep_async(config: SweepConfig, warm_up: bool = True,
                      on_update: Callable[[SweepResult], None] | None = None,
                      make_generator: Callable[..., LoadGenerator] = LoadGenerator) -> SweepResult:
    """Rates in order until one overloads the server. `on_update` sees the result after each rate (partial saves);
    `make_generator(load, session)` sends the requests (another client: `text_stream.TextStreamGenerator`)."""
    result = SweepResult()
    async with open_session() as session:
        generator = make_generator(config.load, session)
        if warm_up:
            await generator.warm_up()
        first_failure: int | None = None  # index of the first rate below the threshold
        for index, rate in enumerate(config.rate_list()):
            if not generator.fits_budget():
                result.stop_reason = f"time budget of {config.load.time_budget_s:g} s reached before {rate:g} req/s"
                break
            runs, summary = await generator.measure(rate)
            result.runs.extend(runs)
            result.summaries.append(summary)
            _log(format_rate_line(summary))
            if on_update is not None:
                on_update(result)
            if summary.audio_within_1s < config.load.stop_fraction:
                result.stop_reason = (f"stopped after {rate:g} req/s: {summary.audio_within_1s:.0%} of requests got "
                                      f"audio within {AUDIO_WITHIN_S:g} s")
                break
            if first_failure is None and summary.attainment < config.failure_threshold:
                first_failure = index
            if config.beyond_failure is not None and first_failure is not None \
                    and index - first_failure >= config.beyond_failure:
                result.stop_reason = (f"stopped {config.beyond_failure} rate(s) after the first below "
                                      f"{config.failure_threshold:.0%} ({config.rate_list()[first_failure]:g} req/s)")
                break
        else:
            result.stop_reason = "all rates run"
    return result


def run_sweep(config: SweepConfig, warm_up: bool = True, on_update: Callable[[SweepResult], None] | None = None,
              make_generator: Callable[..., LoadGenerator] = LoadGenerator) -> SweepResult:
    return asyncio.run(sweep_async(config, warm_up, on_update, make_generator))


def format_rate_line(s: RateSummary) -> str:
    p99 = f"{s.ttfa_p99_s * 1000:.0f} ms" if s.ttfa_p99_s is not None else "n/a"
    return (f"{s.rate:g} req/s: attainment {attainment_percent(s.attainment)}% ({s.num_met}/{s.num_requests}), "
            f"p99 TTFA {p99}, goodput {s.goodput:.2f} req/s, rejected {s.num_rejected}, failed {s.num_failed}, "
            f"stalled {s.num_stalled}")


def _progress_bar(total: int, label: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=False)


def _log(message: str, enabled: bool = True) -> None:
    """A line on stderr as it happens; a measured rate's line always (a background sweep's log shows how far it got)."""
    if enabled:
        print(message, file=sys.stderr, flush=True)
