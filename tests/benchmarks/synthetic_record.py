"""Full benchmark records made up request by request, shaped like a sweep's record.json, for the record and report
tests: each request's fate is chosen by a function of its rate, seed and place in the window."""

from __future__ import annotations

import random
from collections.abc import Callable

from benchmarks.workload import poisson_arrivals

BYTES_PER_SECOND = 48000  # 24 kHz, 16-bit mono PCM
CHUNK_AUDIO_S = 0.32
ON_TIME, LATE, STALL, REJECT, FAIL = "on_time", "late", "stall", "reject", "fail"
Fate = Callable[[float, int, float], str]  # (rate, seed, arrival as a share of the window) -> one of the above


def random_fate(rng: random.Random) -> Fate:
    """Mostly on time, with some of every kind of miss (a stall's pause spread around the threshold)."""
    kinds = [ON_TIME] * 90 + [LATE] * 4 + [STALL] * 3 + [REJECT] * 2 + [FAIL]
    return lambda rate, seed, position: rng.choice(kinds)


def _chunks(rng: random.Random, first_s: float, fate: str, num_chunks: int) -> tuple[list[float], list[int]]:
    """Chunk arrivals a little ahead of playback, jittered; a stall's chunk comes 2-40 ms after the buffer ran out."""
    size = int(CHUNK_AUDIO_S * BYTES_PER_SECOND)
    times, sizes, t = [first_s], [size], first_s
    stall_at = rng.randrange(1, num_chunks) if fate == STALL and num_chunks > 1 else None
    for i in range(1, num_chunks):
        t += CHUNK_AUDIO_S * rng.uniform(0.3, 0.9)
        if i == stall_at:
            t = max(t, first_s + i * CHUNK_AUDIO_S + rng.uniform(0.002, 0.040))
        times.append(t)
        sizes.append(size)
    return times, sizes


def _request(rng: random.Random, index: int, offset_s: float, fate: str, num_chunks: int) -> dict:
    sent = offset_s + rng.uniform(0, 0.002)
    request = {"index": index, "text": f"text {index}", "num_words": 12, "num_frames": 62, "scheduled_s": offset_s,
               "sent_s": sent, "status": 200, "outcome": "completed", "error": None, "retry_after": None,
               "header_bytes": 0, "bytes_per_second": BYTES_PER_SECOND, "chunk_times_s": [], "chunk_audio_bytes": [],
               "finished_s": sent + 0.003}
    if fate == REJECT:
        return {**request, "status": 503, "outcome": "rejected", "error": "overloaded", "retry_after": "1"}
    if fate == FAIL:
        return {**request, "status": 500, "outcome": "failed", "error": "boom"}
    ttfa = rng.uniform(0.25, 0.6) if fate == LATE else rng.uniform(0.03, 0.15)
    times, sizes = _chunks(rng, sent + ttfa, fate, num_chunks)
    return {**request, "chunk_times_s": times, "chunk_audio_bytes": sizes, "finished_s": times[-1] + 0.001}


def synthetic_record(rates: list[float], seeds: tuple[int, ...] = (0, 1, 2), window_s: float = 10.0,
                     fate: Fate | None = None, num_chunks: int = 10, server: str = "ours",
                     rng_seed: int = 0) -> dict:
    """A sweep record (no summaries: the tools under test compute their own) with Poisson arrivals per rate and
    seed."""
    rng = random.Random(rng_seed)
    fate = fate or random_fate(rng)
    runs = []
    for rate in rates:
        for seed in seeds:
            offsets = poisson_arrivals(rate, window_s, seed)
            requests = [_request(rng, i, t, fate(rate, seed, t / window_s), num_chunks) for i, t in enumerate(offsets)]
            runs.append({"rate": rate, "seed": seed, "window_s": window_s, "requests": requests})
    return {"record_version": 1, "kind": "sweep", "server": server, "strategy": "sweep",
            "config": {"load": {"seeds": list(seeds), "window_s": window_s,
                                "slo": {"ttfa_target_s": 0.2, "stall_threshold_s": 0.01}}},
            "summaries": [], "runs": runs}
