"""How many requests the server keeps in progress: a limit learned from the first audio it actually delivers.

The overload guard's frame-demand check and first-audio prediction rest on the cost model. Where the model is wrong
(host time that grows with the number of streams, prefills deferred behind running streams' slack, interference the
costs do not carry) they admit more than the server keeps on time, and then nearly every request misses. This limit
is the feedback that bounds that error, measured on what users get:

- each `window_s`, look at the requests whose first audio came in the window and at the streams whose playback ran
  dry (a chunk due and not delivered);
- a miss window (more than `late_share` of those first audios later than T, or more than `dry_share` of the streams
  dry; deadline-aware admission spends the slack below T on purpose, so first audio near T is no sign of overload)
  lowers the limit to `decrease` of the requests in progress then. Only requests that arrived after the last cut
  count, so the misses of what was admitted before it do not cut again;
- a clean window in which the limit bound (requests in progress within one of it) raises it by `increase`.

Before the first miss window there is no limit. Arrivals past it are refused at once. Pure: the clock is the
caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from vllm_voxserve.scheduler.streams import StreamState
from vllm_voxserve.scheduler.timeline import ChunkSchedule, chunk_deadline


@dataclass(frozen=True, slots=True)
class LimitSettings:
    ttfa_target_s: float
    window_s: float = 0.5
    late_share: float = 0.02
    dry_share: float = 0.01
    decrease: float = 0.9
    increase: float = 0.05
    floor: int = 16  # never below: a short burst on an idle server is no evidence of overload


@dataclass(slots=True)
class ConcurrencyLimit:
    settings: LimitSettings
    schedule: ChunkSchedule
    limit: float = math.inf
    misses: int = 0  # miss windows so far
    _window_start: float | None = None
    _cut_at: float = -math.inf
    _first_audio_s: list[float] = field(default_factory=list)
    _dry_max: float = 0.0
    _bound: bool = False
    _seen: set[str] = field(default_factory=set)

    def admits(self, in_progress: int) -> bool:
        return in_progress < self.limit

    def observe(self, now: float, streams: Iterable[StreamState], in_progress: int) -> None:
        """Called on the guard's demand refresh with every admitted stream and the requests in progress."""
        s = self.settings
        seen, dry, total = set(), 0, 0
        for stream in streams:
            if stream.first_audio_time is None or stream.arrival_time < self._cut_at:
                continue
            seen.add(stream.request_id)
            if stream.request_id not in self._seen:
                self._first_audio_s.append(stream.first_audio_time - stream.arrival_time)
            if stream.generation_done and stream.chunks_delivered >= self.schedule.num_chunks(stream.frames_generated):
                continue
            total += 1
            due = chunk_deadline(self.schedule, stream.chunks_delivered, stream.arrival_time, s.ttfa_target_s,
                                 stream.first_audio_time)
            dry += now > due
        self._seen = seen  # streams that left are forgotten: the set stays as large as the running streams
        self._dry_max = max(self._dry_max, dry / total if total else 0.0)
        self._bound = self._bound or in_progress + 1 >= self.limit
        if self._window_start is None:
            self._window_start = now
        if now - self._window_start >= s.window_s:
            self._close_window(now, in_progress)
            self._window_start = now

    def _close_window(self, now: float, in_progress: int) -> None:
        s = self.settings
        late = sum(t > s.ttfa_target_s for t in self._first_audio_s) > s.late_share * len(self._first_audio_s)
        if late or self._dry_max > s.dry_share:
            self.misses += 1
            self._cut_at = now
            self.limit = max(float(s.floor), s.decrease * min(in_progress, self.limit))
        elif self._bound and math.isfinite(self.limit):
            self.limit += max(1.0, s.increase * self.limit)
        self._first_audio_s, self._dry_max, self._bound = [], 0.0, False
