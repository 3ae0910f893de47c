"""Python's garbage collections in this process between two reports: how many per generation, and how long.

A collection stops every thread of the process, the engine's step loop or the API server's event loop included; an
old-generation one can take milliseconds. The lanes' harvest, where a step allocates the most objects (a tensor and a
record per finished chunk), had a 7-17 ms p99 in run 2026-12-01_21d5739 on the H200 with nothing slow in its code; the
API server's event loop lagged up to 50 ms in one second of 2026-12-07_bfa5679's second start: the engine's step log
and the API server's load line each say whether collections land there.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


class GcPauses:
    """Times every collection through `gc.callbacks` while installed; `report()` summarizes those since the last."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._started: float | None = None
        self._pauses: dict[int, list[float]] = {}  # generation -> seconds of each collection

    def install(self) -> GcPauses:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = self.clock()
        elif phase == "stop" and self._started is not None:
            self._pauses.setdefault(info.get("generation", -1), []).append(self.clock() - self._started)
            self._started = None

    def report(self) -> str:
        """"gen0 412 (0.2 ms total, max 0.01 ms); gen2 1 (...)", oldest generations last; "none" without any."""
        pauses, self._pauses = self._pauses, {}
        return "; ".join(f"gen{g} {len(p)} ({sum(p) * 1e3:.1f} ms total, max {max(p) * 1e3:.2f} ms)"
                         for g, p in sorted(pauses.items())) or "none"


_process: GcPauses | None = None


def process_gc_pauses() -> GcPauses:
    """The process's one installed instance (collections are process-wide; a runtime per test must not add more)."""
    global _process
    if _process is None:
        _process = GcPauses().install()
    return _process
