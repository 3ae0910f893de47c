"""The API server's own load, one log line every `window_s`: how late its event loop wakes, its threads' CPU and
this process's garbage collections (a collection stops the loop).

Every response's audio passes through this process's one event loop: past capacity, the client's first audio came
hundreds of milliseconds after the engine had sent it (2026-12-04_b7fcaeb at 144 req/s: the worker's part p99 under
220 ms, the client's p50 568 ms). The engine's step log cannot see that time; a loop that wakes late from a short
sleep can: its lag is the wait of every callback queued behind the busy loop. Beside it, the first audios as this
process handed them on (from the route's entry): late here but not in the engine's step log, the time went in this
process; late at the client but not here, beyond it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from vllm_voxserve.gc_pauses import GcPauses, process_gc_pauses
from vllm_voxserve.thread_cpu import ThreadCpu

logger = logging.getLogger(__name__)


class ServerLoad:
    """Lags of the loop's short sleeps, reported with the threads' CPU shares and the window's collections once a
    window has passed."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 threads: ThreadCpu | None = None, first_audio_s: Callable[[], list[float]] | None = None,
                 gc_pauses: GcPauses | None = None) -> None:
        self.window_s, self.clock, self.first_audio_s = window_s, clock, first_audio_s
        self.threads = threads if threads is not None else ThreadCpu()
        self.gc_pauses = gc_pauses if gc_pauses is not None else process_gc_pauses()
        self._lags: list[float] = []
        self._since = clock()

    def lag(self, seconds: float) -> str | None:
        """A sleep woke `seconds` late; returns the window's line when the window is over."""
        self._lags.append(max(0.0, seconds))
        if self.clock() - self._since < self.window_s:
            return None
        lags, self._lags, self._since = sorted(self._lags), [], self.clock()
        threads = self.threads.report()
        line = (f"event loop lag ms {_spread(lags)} over {len(lags)} ticks; "
                f"threads, share of a CPU: {threads if threads is not None else 'unknown'}; "
                f"gc collections: {self.gc_pauses.report()}")
        first = sorted(self.first_audio_s()) if self.first_audio_s is not None else []
        if first:
            line += f"; first audio handed on ms {_spread(first)} over {len(first)} requests"
        return line


def _spread(sorted_s: list[float]) -> str:
    ms = [1e3 * sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] for q in (0.5, 0.99)] + [1e3 * sorted_s[-1]]
    return f"p50/p99/max {ms[0]:.1f}/{ms[1]:.1f}/{ms[2]:.1f}"


async def log_server_load(tick_s: float = 0.05, window_s: float = 10.0,
                          first_audio_s: Callable[[], list[float]] | None = None) -> None:
    """Runs for the server's life on its event loop; `first_audio_s`: the first audios' times since its last call."""
    load = ServerLoad(window_s, first_audio_s=first_audio_s)
    while True:
        asked = time.monotonic()
        await asyncio.sleep(tick_s)
        line = load.lag(time.monotonic() - asked - tick_s)
        if line is not None:
            logger.info("voxserve api server load: %s", line)
