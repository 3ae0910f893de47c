"""Admission at the API server's edge: an arrival past what this API server keeps on time is refused at once.

The engine's overload guard sees a request's first audio when the worker sends it; a client sees it after the API
server has handled the request, waited for the engine's answer and passed the audio on, work that grows with every
request in progress here and that the engine cannot see. Past capacity, that time alone took admitted requests past
T while the engine's view stayed near it. So each API server holds the engine's rule (`ConcurrencyLimit`, the same
constants) over its own requests in progress, fed with what it delivers itself:

- a request's first audio, from the route's entry to the first audio bytes it hands to the response (a whole-file
  response: its first audio received), judged against the request's own target where it set one;
- its playback as the API server passes audio on: a stream is dry when the audio handed out so far has played
  (`PlaybackClock`: from its first audio, pushed back by each stall) and the next is not there `dry_grace_s` later.

A route calls `admit(now, engine_full)` at its entry, before reading the request (`engine_full`: the refusal the
engine's in-progress limit would give, `SpeechService.refusal_at_arrival`): an `EdgeRefusal` (answer 503 with
Retry-After; the engine never hears of the request) or an `AdmissionTicket` that the route tells of the first audio
(`first_audio`), of how far the audio handed out plays (`playing_until`) and of the end (`done`, however the request
ends). Off (`overload_mode` "off" or `edge_admission` false) it refuses nothing. The clock is the caller's; each cut
of the limit is logged with what made it. Either way it keeps the first audios' times for the API server's load line
(`take_first_audio_s`): beside the engine's step log they tell time spent in this process from time spent beyond it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from vllm_voxserve.scheduler.concurrency_limit import ConcurrencyLimit, LimitSettings, limit_settings
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

logger = logging.getLogger(__name__)

_KEPT_FIRST_AUDIOS = 1 << 16  # bounds what a guard keeps where no load line takes them (far above a window's)


@dataclass(frozen=True, slots=True)
class EdgeRefusal:
    reason: str
    retry_after_s: float


class AdmissionTicket:
    """One admitted request, from the route's entry to its end."""

    __slots__ = ("_guard", "arrival_time", "target_s", "audio_until", "first_audio_time", "_open")

    def __init__(self, guard: EdgeGuard, arrival_time: float) -> None:
        self._guard = guard
        self.arrival_time = arrival_time
        self.target_s: float | None = None  # the request's own first-audio target (None: the server's T)
        self.audio_until: float | None = None  # when the audio handed out so far has played (None: none yet)
        self.first_audio_time: float | None = None
        self._open = True

    def first_audio(self, now: float) -> None:
        """The request's first audio was handed on at `now` (later calls are ignored)."""
        if self.first_audio_time is None:
            self.first_audio_time = now
            self._guard._first_audio(self, now)

    def playing_until(self, t: float) -> None:
        """The audio handed out so far plays until `t` (the next chunk's deadline)."""
        self.audio_until = t

    def done(self, now: float) -> None:
        """The request ended (answered, failed, or its client left); later calls are ignored."""
        if self._open:
            self._open = False
            self._guard._done(self, now)


class EdgeGuard:
    def __init__(self, settings: LimitSettings, retry_after_s: float, enabled: bool = True) -> None:
        self.limit = ConcurrencyLimit(settings) if enabled else None
        self.retry_after_s = retry_after_s
        self.tickets: set[AdmissionTicket] = set()  # the requests in progress here
        self._looked_at = -math.inf
        self._first_audio_s: list[float] = []  # since the load line last took them

    @classmethod
    def from_policy(cls, cfg: SchedulerPolicyConfig) -> EdgeGuard:
        enabled = cfg.overload_mode == "reject" and cfg.edge_admission
        return cls(limit_settings(cfg), cfg.min_retry_after_s, enabled)

    @property
    def in_progress(self) -> int:
        return len(self.tickets)

    def admit(self, now: float, engine_full: tuple[str, float] | None = None) -> EdgeRefusal | AdmissionTicket:
        if engine_full is not None:
            return EdgeRefusal(*engine_full)
        limit = self.limit
        if limit is not None:
            self._look(now)
            busy = len(self.tickets)
            if limit.refuses(busy):
                return EdgeRefusal(f"server at capacity: {busy} requests in progress at this API server, the most "
                                   f"it has lately kept within the first-audio target is {limit.limit:.0f}",
                                   self.retry_after_s)
        ticket = AdmissionTicket(self, now)
        self.tickets.add(ticket)
        return ticket

    def _look(self, now: float) -> None:
        """Feed the limit a look at the requests in progress, at most every `look_s` (it walks them all)."""
        limit = self.limit
        if now - self._looked_at < limit.settings.look_s and now >= self._looked_at:
            return
        self._looked_at = now
        playing = dry = 0
        for ticket in self.tickets:
            if ticket.audio_until is not None and limit.counts(ticket.arrival_time):
                playing += 1
                dry += now > ticket.audio_until + limit.settings.dry_grace_s
        if limit.observe(now, len(self.tickets), playing, dry):
            logger.info("voxserve edge admission: in-progress limit cut to %.0f at %d in progress (%s)",
                        limit.limit, len(self.tickets), limit.last_cut)

    def take_first_audio_s(self) -> list[float]:
        """The first audios' times (route entry to first audio handed on) since the last call."""
        taken, self._first_audio_s = self._first_audio_s, []
        return taken

    def _first_audio(self, ticket: AdmissionTicket, now: float) -> None:
        if len(self._first_audio_s) < _KEPT_FIRST_AUDIOS:
            self._first_audio_s.append(now - ticket.arrival_time)
        if self.limit is not None:
            # a burst onto an idle server shows as its onset before its own first audios are judged
            self.limit.note_load(now, len(self.tickets))
            self.limit.first_audio(ticket.arrival_time, now - ticket.arrival_time, ticket.target_s)

    def _done(self, ticket: AdmissionTicket, now: float) -> None:
        self.tickets.discard(ticket)
        if self.limit is not None:
            self._look(now)  # windows close on departures too, not only when the next request arrives
