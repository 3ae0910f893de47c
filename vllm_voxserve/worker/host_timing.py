"""Host time the speech side adds to each engine step (its part of the gap between backbone steps), logged as
percentiles every `every` steps. Pure Python: the runtime feeds it `time.perf_counter()` intervals."""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list (q in [0, 1])."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class StepHostTimes:
    """Collects per-step host seconds of named parts; every `every` steps reports p50/p90/p99 of each part and of
    their sum, then starts a new window."""

    def __init__(self, every: int = 2000, report: Callable[[str], None] | None = None):
        self.every = every
        self.report = report or logger.info
        self._window: list[dict[str, float]] = []
        self._current: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self._current[part] = self._current.get(part, 0.0) + seconds

    def end_step(self) -> str | None:
        """Close this step; returns (and reports) the summary line when a window is complete."""
        if self._current:
            self._window.append(self._current)
            self._current = {}
        if len(self._window) < self.every:
            return None
        parts = sorted({p for step in self._window for p in step})
        columns = {p: sorted(step.get(p, 0.0) for step in self._window) for p in parts}
        columns["total"] = sorted(sum(step.values()) for step in self._window)
        line = f"voxserve step host time over {len(self._window)} steps (ms, p50/p90/p99): " + "; ".join(
            f"{name} {percentile(v, 0.5) * 1e3:.3f}/{percentile(v, 0.9) * 1e3:.3f}/{percentile(v, 0.99) * 1e3:.3f}"
            for name, v in columns.items())
        self._window = []
        self.report(line)
        return line
