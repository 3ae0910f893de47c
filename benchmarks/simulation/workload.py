"""Open-loop Poisson arrivals of LibriTTS-like requests (paper §4.1, Appendix B).

Lengths: ≈ 5.2 audio frames per word (18.7 words ↔ 7.8 s at 12.5 frames/s). Words come from the LibriTTS test-clean
texts when the file is present, else from a log-normal fitted to them (log-words mean 2.60, sd 0.88, 1–71 words).
A server does not know a request's exact length in advance: the true length varies around the per-word estimate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from benchmarks.workload import FRAMES_PER_WORD, load_texts, word_count

PROMPT_TEMPLATE_TOKENS = 16  # role and codec-prefix tokens around the text (assumed)
TOKENS_PER_WORD = 1.3
LENGTH_SPREAD = 0.15  # sd of log(true frames / estimated frames), assumed

_REPO_ROOT = Path(__file__).resolve().parents[2]
TEXT_FILES = (
    _REPO_ROOT / "benchmarks" / "data" / "libritts_test_clean.tsv",
    _REPO_ROOT.parent / "shared" / "data" / "libritts_test_clean.tsv",
)


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    arrival_time: float
    words: int
    prompt_tokens: int
    expected_frames: int  # what the endpoint can estimate from the text
    frames: int  # what the model will actually generate


def load_word_counts(path: Path | None = None, max_words: int | None = None) -> list[int] | None:
    """Words of each LibriTTS text, read as the served benchmark reads them (`benchmarks.workload.load_texts`); with
    `max_words`, of those of at most that many words (the served benchmark's `--max-words`)."""
    candidates = (path,) if path else TEXT_FILES
    for candidate in candidates:
        if candidate and candidate.is_file():
            return [word_count(text) for text in load_texts(candidate, max_words)]
    if max_words is not None:
        raise FileNotFoundError("a short-utterance workload needs the LibriTTS texts (benchmarks/data)")
    return None


def _parametric_words(rng: random.Random) -> int:
    return min(max(round(math.exp(rng.gauss(2.60, 0.88))), 1), 71)


def poisson_workload(
    rate: float, window_s: float, seed: int, word_counts: list[int] | None = None
) -> list[SimRequest]:
    """Arrivals at `rate` req/s over `window_s` seconds, on an absolute schedule."""
    if rate <= 0 or window_s <= 0:
        raise ValueError("rate and window_s must be > 0")
    rng = random.Random(seed)
    order = list(word_counts) if word_counts else None
    if order:
        rng.shuffle(order)
    requests = []
    t = rng.expovariate(rate)
    while t < window_s:
        i = len(requests)
        words = order[i % len(order)] if order else _parametric_words(rng)
        expected = max(round(FRAMES_PER_WORD * words), 1)
        frames = max(round(expected * math.exp(rng.gauss(0.0, LENGTH_SPREAD))), 1)
        tokens = PROMPT_TEMPLATE_TOKENS + round(TOKENS_PER_WORD * words)
        requests.append(SimRequest(f"r{i}", t, words, tokens, expected, frames))
        t += rng.expovariate(rate)
    return requests
