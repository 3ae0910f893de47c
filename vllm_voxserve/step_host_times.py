"""The host time each engine step spends in named parts, logged as percentiles over a window. Both the scheduler
(its policy's share of the engine core's thread) and the worker (the speech side's share) keep one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list (q in [0, 1])."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def _spread(name: str, seconds: list[float]) -> str:
    if not seconds:
        return ""
    v = sorted(seconds)
    return f"{name} {percentile(v, 0.5) * 1e3:.3f}/{percentile(v, 0.9) * 1e3:.3f}/{percentile(v, 0.99) * 1e3:.3f}"


class StepHostTimes:
    """Collects per-step host seconds of named parts; every `every` steps, or after `every_s` seconds of at least
    `min_steps` steps (so that a benchmark's 20 s window gets its own lines), reports p50/p90/p99 of each part and of
    their sum, then starts a new window."""

    def __init__(self, every: int = 2000, report: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, every_s: float = 10.0, min_steps: int = 100,
                 title: str = "voxserve step host time"):
        self.every, self.every_s, self.min_steps, self.title = every, every_s, min_steps, title
        self._window_started: float | None = None
        self.report = report or logger.info
        self.clock = clock
        self._window: list[dict[str, float]] = []
        self._current: dict[str, float] = {}
        # beside our share: the time from one step's end to the next (the whole engine step, host and device as the
        # host sees it) and the device time of decode steps with their batch, so one line shows where a step goes
        self._intervals: list[float] = []
        self._last_end: float | None = None
        # the window's longest step interval, when it ended and this timer's parts of it: parts far below the interval
        # put the time outside the code this timer covers (vLLM's own work, the device, a pause of the process)
        self._longest: tuple[float, float, dict[str, float]] = (0.0, 0.0, {})
        self._decode: list[tuple[int, float]] = []
        self._prefill: list[tuple[int, float]] = []  # steps with prompt tokens (mixed with the decode rows)
        self._gauges: dict[str, list[float]] = {}
        self._batches: dict[str, list[tuple[int, float, int]]] = {}
        self._gaps: list[float] = []
        self._counts: dict[str, int] = {}
        self._tallies: dict[str, int] = {}

    def add_count(self, name: str, n: int) -> None:
        """Things made this step (the backbone's frames): their rate over the window's step intervals."""
        self._counts[name] = self._counts.get(name, 0) + n

    def add_tally(self, name: str, n: int) -> None:
        """Events counted over the window (admission decisions by reason): their totals in the line."""
        self._tallies[name] = self._tallies.get(name, 0) + n

    def add_batch(self, name: str, size: int, seconds: float, rows: int = 0) -> None:
        """A finished batch of a side workload (a codec lane): count, mean size, device time and busy share; with
        `rows`, the batch size it ran at (padding included), whose mean the line gives beside the size's."""
        self._batches.setdefault(name, []).append((size, seconds, rows))

    def add_gauge(self, name: str, value: float) -> None:
        """A level sampled once a step (open audio streams, chunks waiting for a codec lane): p50/p99/max."""
        self._gauges.setdefault(name, []).append(value)

    def add_device_gap(self, seconds: float) -> None:
        """The device's idle time before a backbone step (`DeviceStepTimer.gaps`): p50/p90/p99 in the line."""
        self._gaps.append(seconds)

    def add_device_step(self, kind: str, size: int, seconds: float) -> None:
        if kind == "decode":
            self._decode.append((size, seconds))
        elif kind == "prefill":
            self._prefill.append((size, seconds))

    def add(self, part: str, seconds: float) -> None:
        self._current[part] = self._current.get(part, 0.0) + seconds

    def end_step(self) -> str | None:
        """Close this step; returns (and reports) the summary line when a window is complete."""
        step_parts, self._current = self._current, {}
        if step_parts:
            self._window.append(step_parts)
        now = self.clock()
        if self._last_end is not None:
            interval = now - self._last_end
            if interval > self._longest[0]:
                self._longest = (interval, now, step_parts)
            self._intervals.append(interval)
        self._last_end = now
        if self._window_started is None:
            self._window_started = now
        long_enough = len(self._window) >= self.min_steps and now - self._window_started >= self.every_s
        if len(self._window) < self.every and not long_enough:
            return None
        self._window_started = now
        parts = sorted({p for step in self._window for p in step})
        columns = {p: [step.get(p, 0.0) for step in self._window] for p in parts}
        columns["total"] = [sum(step.values()) for step in self._window]
        line = f"{self.title} over {len(self._window)} steps (ms, p50/p90/p99): " + "; ".join(
            _spread(name, v) for name, v in columns.items())
        line += _spread("; step interval", self._intervals)
        if self._intervals:  # a single blocked step (a pause of a second among 600 steps) escapes every percentile
            longest, ended, longest_parts = self._longest
            line += f", longest {longest * 1e3:.1f} ending {now - ended:.1f} s before this line"
            if longest_parts:
                line += " (of it " + ", ".join(f"{p} {sec * 1e3:.1f}" for p, sec in sorted(longest_parts.items())) + ")"
        if self._decode:
            line += _spread("; decode device time", [sec for _, sec in self._decode])
            line += f" at mean batch {sum(n for n, _ in self._decode) / len(self._decode):.1f}"
        line += _spread("; device gap before a step", self._gaps)  # the host time the device waited for
        if self._prefill:  # are the slow steps the ones that carry a prompt?
            line += _spread("; prefill step device time", [sec for _, sec in self._prefill])
            share = len(self._prefill) / (len(self._prefill) + len(self._decode))
            line += (f" at mean {sum(n for n, _ in self._prefill) / len(self._prefill):.0f} prompt tokens"
                     f" ({share:.0%} of steps)")
        wall = sum(self._intervals)
        for name, batches in self._batches.items():
            busy = sum(sec for _, sec, _ in batches)
            rows = sum(r for _, _, r in batches)  # padding rows cost the device as much as chunks do
            line += (f"; {name} {len(batches)} batches of mean {sum(n for n, _, _ in batches) / len(batches):.1f}"
                     + (f" run as {rows / len(batches):.1f}" if rows else "")
                     + _spread(", device time", [sec for _, sec, _ in batches])
                     + (f", busy {busy / wall:.0%}" if wall > 0 else ""))
        for name, values in self._gauges.items():
            v = sorted(values)
            line += f"; {name} {percentile(v, 0.5):g}/{percentile(v, 0.99):g}/{v[-1]:g}"
        if wall > 0:
            line += "".join(f"; {name} {total / wall:.0f}/s" for name, total in self._counts.items())
        line += "".join(f"; {name} {total}" for name, total in self._tallies.items())
        self._window, self._intervals, self._decode, self._prefill, self._gauges, self._batches, self._gaps = (
            [], [], [], [], {}, {}, [])
        self._counts, self._tallies, self._longest = {}, {}, (0.0, 0.0, {})
        self.report(line)
        return line
