"""The device time of each backbone step (for the scheduler's cost model), read from CUDA events."""

from __future__ import annotations

from collections.abc import Callable


class DeviceStepTimer:
    """Device time of each backbone step, from a pair of CUDA events around it, read back without waiting.

    With asynchronous scheduling the host runs ahead of the GPU, so host timings of a step mean little; the events
    say what the step cost on the device. `harvest()` returns (step, seconds) for the steps whose end event has
    completed, oldest first, `step` being what `start` was given. `event_factory` makes timing events (tests pass
    fakes)."""

    # A longer gap between two steps is an idle server (nothing to run), not host time.
    MAX_GAP_S = 1.0

    def __init__(self, event_factory: Callable[[], object], max_pending: int = 64):
        self.event_factory = event_factory
        self.max_pending = max_pending
        self._open: tuple[tuple, object] | None = None
        self._pending: list[tuple[tuple, object, object]] = []
        self._last_end: object | None = None  # the end event of the last harvested step
        # The device's time from one step's end (after sampling) to the next step's start (our input hook, after
        # vLLM's own input copies): idle while the host prepares, plus those copies. Seconds, harvested steps in
        # order; the caller reads and clears it.
        self.gaps: list[float] = []

    def start(self, step: tuple) -> None:
        """`step`: what the step is (the caller's description, handed back with its time)."""
        event = self.event_factory()
        event.record()
        self._open = (step, event)

    def stop(self) -> None:
        if self._open is None:
            return
        step, start = self._open
        self._open = None
        end = self.event_factory()
        end.record()
        self._pending.append((step, start, end))
        if len(self._pending) > self.max_pending:  # nobody harvests (e.g. no scheduler reads reports): drop oldest
            del self._pending[0]
            self._last_end = None  # the next gap would span the dropped step

    def harvest(self) -> list[tuple[tuple, float]]:
        done = []
        while self._pending and self._pending[0][2].query():
            step, start, end = self._pending.pop(0)
            done.append((step, start.elapsed_time(end) / 1000.0))
            if self._last_end is not None:
                gap = self._last_end.elapsed_time(start) / 1000.0
                if 0.0 <= gap <= self.MAX_GAP_S:
                    self.gaps.append(gap)
            self._last_end = end
        del self.gaps[:-4096]  # bounded when nobody reads it
        return done
