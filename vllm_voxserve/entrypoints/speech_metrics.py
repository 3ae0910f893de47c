"""Speech metrics on vLLM's own `/metrics`: what a listener of each stream lives through, measured in the API server.

`PlaybackClock` is the server's model of a player (pure: no vLLM, no clock of its own): playback starts when the
first audio arrives; a chunk is due when the audio before it has played out; a chunk that comes after its deadline
is late by the difference and the player stalls that long, which pushes every later deadline back as far.

`SpeechMetrics` holds the prometheus_client objects, in the registry vLLM serves (the default one; with several API
servers vLLM sets PROMETHEUS_MULTIPROC_DIR and the same objects write there). Names follow vLLM's `vllm:` style.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from .edge_admission import AdmissionTicket

TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
LATENESS_BUCKETS = (0.0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REFUSAL_REASONS = ("invalid", "too_large", "overloaded", "api_server_limit", "failed")


@dataclass
class PlaybackClock:
    """Deadlines of one stream's chunks for a player that starts at the first audio and stalls when starved."""

    sample_rate: int
    started_at: float | None = None
    played_samples: int = 0  # audio delivered before the next chunk
    stalled_s: float = 0.0  # total time the player waited so far

    def arrive(self, now: float, samples: int) -> float:
        """Record a chunk of `samples` arriving at `now`; returns its lateness in seconds (0 when on time)."""
        if self.started_at is None:
            self.started_at = now
            self.played_samples = samples
            return 0.0
        due = self.started_at + self.stalled_s + self.played_samples / self.sample_rate
        lateness = max(0.0, now - due)
        self.stalled_s += lateness
        self.played_samples += samples
        return lateness

    def plays_until(self) -> float:
        """When the audio received so far has played out (the next chunk's deadline); after the first `arrive`."""
        return self.started_at + self.stalled_s + self.played_samples / self.sample_rate


class SpeechMetrics:
    """The speech API's Prometheus series, labelled with the served model's name like vLLM's own."""

    _instance: SpeechMetrics | None = None

    @classmethod
    def get(cls, model_name: str) -> SpeechMetrics:
        """One set per process: prometheus_client refuses a second registration of a name."""
        if cls._instance is None:
            cls._instance = cls()
        if cls._instance.model_name != model_name:
            cls._instance._label(model_name)
        return cls._instance

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["model_name"]
        self.model_name: str | None = None  # set, with its series, by `get`
        self.ttfa = Histogram("vllm:voxserve_ttfa_seconds",
                              "Time from a speech request's arrival to its first audio chunk, in seconds.",
                              labels, buckets=TTFA_BUCKETS)
        self.chunk_lateness = Histogram(
            "vllm:voxserve_chunk_lateness_seconds",
            "How late each streamed audio chunk came against a player that started at the first audio, in seconds "
            "(0 when on time).", labels, buckets=LATENESS_BUCKETS)
        self.stalls = Counter("vllm:voxserve_stalls",
                              "Streamed audio chunks that came after the player ran out of audio.", labels)
        self.stall_seconds = Counter("vllm:voxserve_stall_seconds",
                                     "Seconds streamed players waited for audio after it started.", labels)
        self.refused = Counter("vllm:voxserve_requests_refused",
                               "Speech requests answered without audio, by reason (invalid: 400, too_large: 413, "
                               "overloaded: 503 from the engine's admission, api_server_limit: 503 at arrival from "
                               "this API server's limit on requests in progress, failed: 500).", [*labels, "reason"])
        self.rank_retries = Counter("vllm:voxserve_rank_retries",
                                    "Speech requests a data-parallel rank refused that were sent to another rank.",
                                    labels)
        self.running_streams = Gauge("vllm:voxserve_running_streams",
                                     "Speech requests accepted and not yet ended (streamed or whole-file).", labels,
                                     multiprocess_mode="livesum")
        self.audio_seconds = Counter("vllm:voxserve_audio_seconds",
                                     "Seconds of speech audio sent to clients.", labels)

    def _label(self, model_name: str) -> None:
        """The series of one model, looked up once: `labels()` validates and locks at each call, and the chunk
        series are updated for every chunk of every stream."""
        self.model_name = model_name
        self._ttfa, self._chunk_lateness = self.ttfa.labels(model_name), self.chunk_lateness.labels(model_name)
        self._stalls, self._stall_seconds = self.stalls.labels(model_name), self.stall_seconds.labels(model_name)
        self._running_streams = self.running_streams.labels(model_name)
        self._audio_seconds = self.audio_seconds.labels(model_name)

    def refuse(self, reason: str) -> None:
        self.refused.labels(self.model_name, reason).inc()

    def retried_on_another_rank(self) -> None:
        self.rank_retries.labels(self.model_name).inc()

    def first_audio(self, waited_s: float) -> None:
        self._ttfa.observe(waited_s)

    def audio(self, seconds: float) -> None:
        self._audio_seconds.inc(seconds)

    def streamed_chunk(self, lateness_s: float) -> None:
        self._chunk_lateness.observe(lateness_s)
        if lateness_s > 0:  # (the series exist from the model's first request on, at 0 until a stall)
            self._stalls.inc()
            self._stall_seconds.inc(lateness_s)

    def stream_started(self) -> None:
        self._running_streams.inc()

    def stream_ended(self) -> None:
        self._running_streams.dec()


async def metered(chunks, metrics: SpeechMetrics, ticket: AdmissionTicket, streamed: bool, sample_rate: int,
                  clock: Callable[[], float] = time.monotonic) -> AsyncIterator[np.ndarray]:
    """`chunks` passed through, measured: TTFA (from the ticket's arrival) at the first chunk, then (streamed
    responses only) each chunk's lateness against `PlaybackClock`; counted among the running streams until it ends.
    The request's admission ticket hears how far the audio plays, its end, and a whole file's first audio (a
    stream's is its first bytes handed to the response). Closing this generator closes `chunks` (which aborts the
    request)."""
    playback = PlaybackClock(sample_rate)
    metrics.stream_started()
    try:
        async for chunk in chunks:
            now = clock()
            if playback.started_at is None:
                metrics.first_audio(now - ticket.arrival_time)
                if not streamed:
                    ticket.first_audio(now)
            lateness = playback.arrive(now, len(chunk))
            ticket.playing_until(playback.plays_until())
            metrics.audio(len(chunk) / sample_rate)
            if streamed:
                metrics.streamed_chunk(lateness)
            yield chunk
    finally:
        metrics.stream_ended()
        ticket.done(clock())
        await chunks.aclose()
