"""Request texts and arrival schedules: seeded text orders, Poisson arrivals, fixed lengths for random weights."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
LIBRITTS_TEST_CLEAN = DATA_DIR / "libritts_test_clean.tsv"
# The paper's workload: 18.7 words <-> 7.8 s of audio at 12.5 frames per second.
FRAMES_PER_WORD = 5.2


def load_texts(path: str | Path | None = None, max_words: int | None = None) -> list[str]:
    """Texts from a TSV with a `utt_id<TAB>text` header (LibriTTS) or a plain file with one text per line; with
    `max_words`, only those of at most that many words (a short-utterance workload)."""
    if max_words is not None and max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    path = Path(path) if path is not None else LIBRITTS_TEST_CLEAN
    lines = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines()]
    if lines and lines[0].split("\t")[:1] == ["utt_id"]:
        texts = [line.split("\t", 1)[1].strip() for line in lines[1:] if "\t" in line]
    else:
        texts = [line.strip() for line in lines]
    texts = [t for t in texts if t and (max_words is None or word_count(t) <= max_words)]
    if not texts:
        raise ValueError(f"no texts in {path}" + (f" of at most {max_words} words" if max_words else ""))
    return texts


def word_count(text: str) -> int:
    return len(text.split())


def frames_for_text(text: str, frames_per_word: float = FRAMES_PER_WORD) -> int:
    """The fixed number of audio frames a random-weight model generates for `text`."""
    if frames_per_word <= 0:
        raise ValueError(f"frames_per_word must be > 0, got {frames_per_word}")
    return max(1, round(word_count(text) * frames_per_word))


def poisson_arrivals(rate: float, window_s: float, seed: int | str) -> list[float]:
    """Arrival offsets in [0, window_s) of a Poisson process of `rate` req/s, reproducible from `seed`."""
    if rate <= 0 or window_s <= 0:
        raise ValueError(f"rate and window_s must be > 0, got {rate}, {window_s}")
    rng = random.Random(f"arrivals:{seed}:{float(rate)!r}")  # 4 and 4.0 give the same arrivals
    arrivals, t = [], rng.expovariate(rate)
    while t < window_s:
        arrivals.append(t)
        t += rng.expovariate(rate)
    return arrivals


class TextOrder:
    """An endless, seeded walk through the texts: each pass is a fresh shuffle, so each seed has its own order."""

    def __init__(self, texts: list[str], seed: int | str):
        if not texts:
            raise ValueError("no texts")
        self._texts = list(texts)
        self._rng = random.Random(f"texts:{seed}")
        self._order: list[int] = []

    def next(self) -> str:
        if not self._order:
            self._order = list(range(len(self._texts)))
            self._rng.shuffle(self._order)
            self._order.reverse()  # pop() from the end walks the shuffle front to back
        return self._texts[self._order.pop()]


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    offset_s: float  # arrival time from the run's start
    text: str
    num_frames: int | None  # set for fixed-length (random-weight) runs
    seed: int  # per-request sampling seed sent to servers that take one


def plan_run(rate: float, window_s: float, seed: int, order: TextOrder, fixed_length: bool,
             frames_per_word: float = FRAMES_PER_WORD) -> list[PlannedRequest]:
    """The requests of one (rate, seed) arrival window, texts drawn in the seed's order."""
    planned = []
    for i, offset in enumerate(poisson_arrivals(rate, window_s, seed)):
        text = order.next()
        frames = frames_for_text(text, frames_per_word) if fixed_length else None
        planned.append(PlannedRequest(i, offset, text, frames, seed * 1_000_003 + i))
    return planned
