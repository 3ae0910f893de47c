"""How many requests a server keeps in progress: a limit learned from the first audio it actually delivers.

The overload guard's frame-demand check and first-audio prediction rest on the cost model. Where the model is wrong
(host time that grows with the number of streams, prefills deferred behind running streams' slack, interference the
costs do not carry) they admit more than the server keeps on time, and then nearly every request misses. This limit
is the feedback that bounds that error, measured on what users get:

- each `window_s`, look at the requests whose first audio came in the window and at the streams whose playback ran
  dry (a chunk overdue by more than `dry_grace_s` and not delivered);
- a miss window (more than `late_share` of those first audios later than their target and at least `min_late` of
  them, or more than `dry_share` of the streams dry at one look and at least `min_dry`; deadline-aware admission
  spends the slack below T on purpose, so first audio near T is no sign of overload) lowers the limit to `decrease`
  of the requests in progress then. Only requests that arrived after the last cut count, so the misses of what was
  admitted before it do not cut again. The counts keep chance out: a window holds a few dozen first audios, so one
  late among them, which a server meeting a 99 % target has every few windows, would exceed any share and cut in
  the middle of a Poisson burst the server keeps on time; an overload makes many late at once;
- a clean window in which the limit bound (requests in progress within one of it at a look, or an arrival refused for
  it) raises it by `increase`, doubled for each such window since the last cut or the last late first audio, up to
  `max_increase`. A burst of simultaneous arrivals makes first audio late (their prefills queue) at far fewer requests
  in progress than the server keeps on time once arrivals spread out, and a limit that then regrew 5 % a window refused
  for seconds at a rate the server serves: a 64-request burst cut the API server's limit to 52 and 157 of 2,468 requests
  were refused in the next 10 s at 80 req/s, where the same server's next two windows at that rate refused 11 of 4,867
  (2026-12-04_4af55f2, start 3). Near capacity a late first audio or two, too few to cut, come first: they keep the
  raises small there.

A burst onto an idle server is no evidence: where a look finds more than `floor` requests in progress after looks
that found at most that many, the first audios of requests that arrived during those idle looks or within `window_s`
after the last of them neither cut nor count. Their prefills queue behind each other, so some come late at far fewer
requests in progress than the same server keeps on time once arrivals spread out: 64 simultaneous requests onto an
idle server cut the API server's limit to 52 (9 of 64 late), and at 96 req/s, which reached 177 in progress in the
next two 30 s windows and lost 1 request of 5,738 there, the limit refused 72 requests in the 7.4 s it took to grow
back (2026-12-04_9d9481d). A load that the server cannot keep still cuts half a second later, from the requests that
arrived after the onset; a server that never idles (every overload) has no onsets.

Before the first miss window there is no limit. Arrivals past it are refused at once. `last_cut` says what made the
latest cut (the guards log it: refusals whose cause nobody can name cannot be tuned away).

Two guards hold one: the engine's overload guard (`StreamEvidence` feeds it the scheduler's streams) and the API
server's edge guard (`entrypoints/edge_admission.py`: first audio and playback as it hands them to responses, which
includes the time a request spends in the API server, outside the engine's view). The limit itself takes plain
numbers. Pure: the clock is the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import StreamState
from vllm_voxserve.scheduler.timeline import ChunkSchedule, chunk_deadline


# How long an idle stretch is kept: longer than any first audio takes to come (a request's first audio that comes
# later than this after a burst onto an idle server is judged as evidence).
_ONSET_MEMORY_S = 30.0


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """The rule's constants, for both guards (`limit_settings` builds the served ones)."""

    ttfa_target_s: float
    floor: int  # never below: a short burst on an idle server is no evidence of overload
    window_s: float = 0.5
    late_share: float = 0.02
    dry_share: float = 0.01
    min_late: int = 3
    min_dry: int = 2
    # A stream is dry once its next chunk is this far overdue, not at the first instant: the SLO itself lets 10 ms of
    # pause pass, the engine learns of deliveries a step report or two after the worker made them (step intervals
    # p90 20-25 ms at 80-96 req/s on the H200), and the API server looks every `look_s`. Without it, on
    # 2026-12-04_904736d 46 of the 52 clusters of refusals below capacity followed no late first audio and no stall
    # at the client.
    dry_grace_s: float = 0.05
    decrease: float = 0.9
    increase: float = 0.05  # the first raise after a cut, a share of the limit
    max_increase: float = 0.25  # the largest raise, once clean windows in a row have doubled it
    # how often the edge guard walks its open requests for dry ones (the engine's guard looks at each demand refresh)
    look_s: float = 0.05


def limit_settings(cfg: SchedulerPolicyConfig) -> LimitSettings:
    return LimitSettings(cfg.ttfa_target_s, cfg.limit_floor, min_late=cfg.limit_min_late)


@dataclass(slots=True)
class ConcurrencyLimit:
    settings: LimitSettings
    limit: float = math.inf
    misses: int = 0  # miss windows so far
    _window_start: float | None = None
    _cut_at: float = -math.inf
    _first_audios: int = 0
    _late: int = 0
    _dry: bool = False  # a look in this window found too many streams dry
    _dry_seen: tuple[int, int] = (0, 0)  # (dry, playing) at the look that found them
    _bound: bool = False
    _raises: int = 0  # windows that raised the limit since the last cut or late first audio
    _cut_causes: dict[str, str] = field(default_factory=dict)  # the latest cut's triggers, each with its evidence
    _idle: tuple[float, float] | None = None  # the current idle stretch: its first and latest look
    _idle_stretches: list[tuple[float, float]] = field(default_factory=list)  # recent ones, the same way

    @property
    def last_cut(self) -> str:
        """What made the latest cut: "late: 4 of 37 first audios", "dry: 3 of 60 streams" or both."""
        return ", ".join(f"{cause}: {detail}" for cause, detail in self._cut_causes.items())

    @property
    def last_cut_cause(self) -> str:
        """The latest cut's trigger alone: "late", "dry" or "late and dry"."""
        return " and ".join(self._cut_causes)

    def admits(self, in_progress: int) -> bool:
        return in_progress < self.limit

    def refuses(self, in_progress: int) -> bool:
        """Whether an arrival at `in_progress` is refused; a refusal is the limit binding in this window, whatever the
        looks saw. A guard looks at most every refresh while arrivals come every few ms, and the arrivals an API server
        refuses for the engine's limit keep the engine's count below it at its looks: on 2026-12-07_ed47d1f the engine's
        limit, cut once at 104 req/s, stayed at 184 for two 30 s windows at 112 while 89 arrivals were refused for it
        and no first audio came late."""
        refused = not self.admits(in_progress)
        self._bound = self._bound or refused
        return refused

    def counts(self, arrival_time: float) -> bool:
        """Whether what happens to a request that arrived at `arrival_time` is evidence: it came after the last cut."""
        return arrival_time >= self._cut_at

    def first_audio(self, arrival_time: float, waited_s: float, target_s: float | None = None) -> None:
        """A request's first audio, `waited_s` after its arrival; late past `target_s` (None: the server's T)."""
        if arrival_time < self._cut_at or self._in_onset(arrival_time):
            return
        self._first_audios += 1
        self._late += waited_s > (self.settings.ttfa_target_s if target_s is None else target_s)

    def observe(self, now: float, in_progress: int, playing: int = 0, dry: int = 0) -> bool:
        """A look at the server: the requests in progress and, of the streams playing that arrived after the last cut
        (`counts`), how many ran dry. Closes the window when it is due; True when that cut the limit."""
        s = self.settings
        self.note_load(now, in_progress)
        if not self._dry and dry >= s.min_dry and dry > s.dry_share * playing:
            self._dry, self._dry_seen = True, (dry, playing)
        self._bound = self._bound or in_progress + 1 >= self.limit
        if self._window_start is None:
            self._window_start = now
        if now - self._window_start < s.window_s:
            return False
        self._window_start = now
        return self._close_window(now, in_progress)

    def _in_onset(self, arrival_time: float) -> bool:
        """Whether a request arrived at the onset of a busy spell: while the server was idle, or within `window_s`
        after, in an idle stretch that a busy look ended (a server that stays idle has no onset)."""
        # newest first: the stretches are disjoint and in time order, and a first audio's arrival is recent, so the
        # walk stops at the first stretch that ended too long before it (a load hovering at the floor leaves many)
        for first, last in reversed(self._idle_stretches):
            if last + self.settings.window_s < arrival_time:
                return False
            if first <= arrival_time:
                return True
        return False

    def note_load(self, now: float, in_progress: int) -> None:
        """A look at the requests in progress, for the onsets: `observe` takes one; a caller about to report first
        audio takes one first, so that a burst's first audios find its onset. Idle: at most `floor` in progress."""
        if in_progress <= self.settings.floor:
            self._idle = (now, now) if self._idle is None else (self._idle[0], now)
        elif self._idle is not None:
            self._idle_stretches = [(a, b) for a, b in self._idle_stretches if b > now - _ONSET_MEMORY_S]
            self._idle_stretches.append(self._idle)
            self._idle = None

    def _close_window(self, now: float, in_progress: int) -> bool:
        s = self.settings
        late = self._late >= s.min_late and self._late > s.late_share * self._first_audios
        cut = late or self._dry
        if cut:
            self.misses += 1
            causes = {"late": f"{self._late} of {self._first_audios} first audios"} if late else {}
            if self._dry:
                causes["dry"] = f"{self._dry_seen[0]} of {self._dry_seen[1]} streams"
            self._cut_causes = causes
            self._cut_at = now
            self.limit = max(float(s.floor), s.decrease * min(in_progress, self.limit))
            self._raises = 0
        elif self._bound and math.isfinite(self.limit):
            if self._late:  # near capacity, where a late one or two come before a cut: grow slowly from here
                self._raises = 0
            share = min(s.max_increase, s.increase * 2 ** self._raises)
            self.limit += max(1.0, share * self.limit)
            self._raises += 1
        self._first_audios, self._late, self._dry, self._bound = 0, 0, False, False
        return cut


@dataclass(slots=True)
class StreamEvidence:
    """The engine's view for a limit: each admitted stream's first audio (once), and at each look the streams whose
    next chunk is past its deadline (`timeline.chunk_deadline`) while audio is still to come."""

    limit: ConcurrencyLimit
    schedule: ChunkSchedule
    _seen: set[str] = field(default_factory=set)

    def observe(self, now: float, streams: Iterable[StreamState], in_progress: int) -> bool:
        """True when this look cut the limit (`ConcurrencyLimit.observe`)."""
        limit, ttfa = self.limit, self.limit.settings.ttfa_target_s
        limit.note_load(now, in_progress)  # before the first audios: a burst's own find its onset
        seen, dry, playing = set(), 0, 0
        for stream in streams:
            if stream.first_audio_time is None or not limit.counts(stream.arrival_time):
                continue
            seen.add(stream.request_id)
            if stream.request_id not in self._seen:
                limit.first_audio(stream.arrival_time, stream.first_audio_time - stream.arrival_time)
            if stream.generation_done and stream.chunks_delivered >= self.schedule.num_chunks(stream.frames_generated):
                continue
            playing += 1
            due = chunk_deadline(self.schedule, stream.chunks_delivered, stream.arrival_time, ttfa,
                                 stream.first_audio_time)
            dry += now > due + limit.settings.dry_grace_s
        self._seen = seen  # streams that left are forgotten: the set stays as large as the running streams
        return limit.observe(now, in_progress, playing, dry)
