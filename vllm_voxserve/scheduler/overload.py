"""Load shedding past capacity, explainable to users (overload_mode="reject", the default).

Past capacity either lane can bind: the backbone (frames a step, `max_decode_batch` rows at most) or the background
codec lane (chunks a batch on its partition). `capacity.CapacityModel` says what each delivers in frames per second,
from the cost model and the measured step interval, both updated online.

- At arrival, reject (HTTP 503 with Retry-After) when
  1. playing every admitted stream without a stall, plus this request, needs more frames within some horizon
     (`demand_horizons_s`) than `capacity_headroom` of what a lane makes in that time: frames to generate, against
     the backbone (due δu early, when a chunk would turn urgent), and frames generated or not yet decoded past each
     stream's first chunk (the urgent lane's), against the codec lane. Checking the backbone alone admitted up to
     what the backbone makes while the codec lane, short of it, fell behind: every admitted stream stalled; or
  2. its predicted first audio (the time since it arrived, the prefills queued ahead of it, its own, its first
     chunk at the predicted step interval, and the first chunk's way to audio as measured,
     `CapacityModel.first_audio_handover_s`) is later than T. With `first_audio_step_growth` those steps are
     predicted at the rows they will carry: the requests in progress now plus half of what their number grew by
     over the last `_GROWTH_WINDOW_S`, continued for as long as the first audio takes (no growth at a steady load,
     where as many end as start), and with the host time a row adds (`CapacityModel.first_audio_step_s`).
- While waiting, reject a request that can no longer reach its first audio within T: serving it late would cost
  running streams their deadlines and still miss.
- Before either rule, with `feedback_limit`, refuse an arrival past the limit on requests in progress that
  `concurrency_limit.ConcurrencyLimit` learns from the first audio actually delivered: the rules above trust the
  cost model, the limit bounds what its errors admit. Each API server holds the same rule over its own requests
  (`entrypoints/edge_admission.py`), on what it delivers; this one still guards what reaches the engine (from
  several API servers, for one).

The streams' demand is computed at most every `demand_refresh_s` (it walks every stream for every horizon, in the
engine's one thread); requests accepted in between add theirs to it. `decisions` counts what was decided and why,
for the step log.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Sequence

from vllm_voxserve.scheduler.capacity import CapacityModel
from vllm_voxserve.scheduler.concurrency_limit import ConcurrencyLimit, StreamEvidence, limit_settings
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest, schedule_of
from vllm_voxserve.scheduler.timeline import ChunkSchedule, chunk_deadline

ACCEPTED = "accepted"
REFUSED_BACKBONE = "refused: backbone frames"
REFUSED_CODEC = "refused: codec frames"
REFUSED_FIRST_AUDIO = "refused: first audio late"
REFUSED_LIMIT = "refused: in-progress limit"
SHED_WAITING = "shed while waiting"
# How far back the growth of the requests in progress is measured (`first_audio_step_growth`): about as long as a
# first audio takes, so that a burst's onset counts while its first audios are still to come.
_GROWTH_WINDOW_S = 0.25


@dataclass(frozen=True, slots=True)
class Rejection:
    request_id: str
    retry_after_s: float
    reason: str
    by_limit: bool = False  # refused for the number of requests in progress alone (`contract.EngineRejection`)


def frames_due_by(
    t: float, total_frames: int, arrival_time: float, first_audio_time: float | None, schedule: ChunkSchedule,
    ttfa_target_s: float,
) -> int:
    """Frames a request must have out by time t so that every chunk due by then can be on time."""
    if t < arrival_time + ttfa_target_s:
        return 0
    start = first_audio_time if first_audio_time is not None else arrival_time + ttfa_target_s
    played = int((t - start) / schedule.frame_duration_s + 1e-9)  # frames played by t (exact multiples count)
    return min(schedule.end_frame(schedule.chunk_of_frame(max(played, 0))), total_frames)


def frames_needed_by(
    t: float,
    frames_generated: int,
    total_frames: int,
    arrival_time: float,
    first_audio_time: float | None,
    schedule: ChunkSchedule,
    ttfa_target_s: float,
) -> int:
    """Frames a request must still generate by time t so that every chunk due by then can be on time."""
    due = frames_due_by(t, total_frames, arrival_time, first_audio_time, schedule, ttfa_target_s)
    return max(due - frames_generated, 0)


@dataclass(slots=True)
class FrameDemand:
    """Per horizon of `demand_horizons_s`: frames the backbone must generate, frames the codec lane must decode."""

    backbone: list[int]
    codec: list[int]

    def add(self, other: "FrameDemand") -> None:
        self.backbone = [a + b for a, b in zip(self.backbone, other.backbone)]
        self.codec = [a + b for a, b in zip(self.codec, other.codec)]


def in_progress(streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]) -> int:
    """Requests still generating or waiting for their prefill."""
    return sum(not s.generation_done for s in streams) + len(waiting)


class OverloadGuard:
    def __init__(self, cfg: SchedulerPolicyConfig, costs: CostModel, capacity: CapacityModel | None = None,
                 limit: ConcurrencyLimit | None = None) -> None:
        """`capacity` and `limit` given: another guard's, shared by one that judges requests with another T (it
        checks the limit; the guard that made it keeps it up to date)."""
        self.cfg = cfg
        self.costs = costs
        self.capacity = capacity or CapacityModel(cfg, costs)
        self.schedule = schedule_of(cfg)
        self.decisions: Counter[str] = Counter()
        self._demand: FrameDemand | None = None
        self._demand_at = 0.0
        self.limit = limit
        self._evidence = None  # the guard that made the limit keeps it up to date from the streams it sees
        self._loads: deque[tuple[float, int]] = deque()  # (time, requests in progress) at the latest arrivals
        self.rows_growth_per_s = 0.0  # how fast the requests in progress grew lately (`first_audio_step_growth`)
        if limit is None and cfg.feedback_limit:
            self.limit = ConcurrencyLimit(limit_settings(cfg))
            self._evidence = StreamEvidence(self.limit, self.schedule)

    @property
    def enabled(self) -> bool:
        return self.cfg.overload_mode == "reject"

    def step_s(self, running: int) -> float:
        return self.capacity.step_s(running)

    def first_audio_s(self, request: WaitingRequest, running: int, queued_ahead: int) -> float:
        """Predicted time from now to the request's first audio."""
        rows = running + queued_ahead + 1
        steps = queued_ahead // self.cfg.max_prefills_per_step + self.cfg.first_chunk_frames
        own = self.costs.prefill_s(request.prompt_tokens) + self.capacity.first_audio_handover_s()
        if not self.cfg.first_audio_step_growth:
            return steps * self.step_s(rows) + own
        first = steps * self.capacity.first_audio_step_s(rows) + own
        later = rows + round(self.rows_growth_per_s * first / 2)  # the rows its steps carry, on average
        return steps * self.capacity.first_audio_step_s(later) + own

    def _note_load(self, now: float, busy: int) -> None:
        """The requests in progress at an arrival, for `rows_growth_per_s`."""
        loads = self._loads
        loads.append((now, busy))
        while len(loads) > 1 and loads[1][0] <= now - _GROWTH_WINDOW_S:
            loads.popleft()
        then, before = loads[0]
        span = now - then
        self.rows_growth_per_s = max(busy - before, 0) / span if span >= _GROWTH_WINDOW_S / 2 else 0.0

    def frame_demand(
        self, now: float, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]
    ) -> FrameDemand:
        """What the admitted requests need within each horizon to play without a stall: generated δu before a
        chunk's deadline (when it would turn urgent), decoded by it (first chunks excepted: the urgent lane's)."""
        horizons = self.cfg.demand_horizons_s
        n = len(horizons)
        lm_ends = [now + h + self.cfg.urgent_margin_s for h in horizons]
        codec_ends = [now + h for h in horizons]
        ttfa, default, schedule = self.cfg.ttfa_target_s, self.cfg.default_expected_frames, self.schedule
        first, size, frame_s = schedule.first_chunk_frames, schedule.chunk_frames, schedule.frame_duration_s
        backbone, codec = [0] * n, [0] * n
        requests = [(s.frames_generated, schedule.start_frame(s.chunks_delivered),
                     s.frames_generated if s.generation_done else max(s.expected_frames or default,
                                                                      s.frames_generated + 1),
                     s.arrival_time, s.first_audio_time) for s in streams]
        requests += [(0, 0, w.expected_frames or default, w.arrival_time, None) for w in waiting]
        for generated, decoded, total, arrival, first_audio in requests:
            decoded = max(decoded, first)  # the first chunk is the urgent lane's
            if generated >= total and decoded >= total:
                continue  # nothing left to make: most streams late in their playback
            due_from = arrival + ttfa
            start = first_audio if first_audio is not None else due_from
            # inline `frames_due_by` (it runs for every stream and horizon, in the engine's thread)
            for ends, done, out in ((lm_ends, generated, backbone), (codec_ends, decoded, codec)):
                if done >= total:
                    continue
                for i in range(n):
                    t = ends[i]
                    if t < due_from:
                        continue
                    played = int((t - start) / frame_s + 1e-9)
                    due = first if played < first else first + size * (1 + (played - first) // size)
                    if due > total:
                        due = total
                    if due > done:
                        out[i] += due - done
        return FrameDemand(backbone, codec)

    def _current_demand(
        self, now: float, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]
    ) -> FrameDemand:
        if self._demand is None or now - self._demand_at >= self.cfg.demand_refresh_s or now < self._demand_at:
            self._demand, self._demand_at = self.frame_demand(now, streams, waiting), now
            evidence = self._evidence
            if evidence is not None and evidence.observe(now, streams, in_progress(streams, waiting)):
                self.decisions[f"limit cut: {self.limit.last_cut_cause}"] += 1  # the step log names the trigger
        return self._demand

    def check_arrival(
        self, now: float, request: WaitingRequest, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]
    ) -> Rejection | None:
        """None to accept; otherwise the rule the request breaks, with a reason a user can act on."""
        if not self.enabled:
            return None
        return self._check(now, request, streams, waiting)

    def _check(
        self, now: float, request: WaitingRequest, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]
    ) -> Rejection | None:
        demand = self._current_demand(now, streams, waiting)
        growth = self.cfg.first_audio_step_growth
        busy = in_progress(streams, waiting) if self.limit is not None or growth else 0
        if growth:
            self._note_load(now, busy)
        if self.limit is not None and self.limit.refuses(busy):
            self.decisions[REFUSED_LIMIT] += 1
            reason = (f"server at capacity: {busy} requests in progress, the most it has lately kept within the "
                      f"first-audio target is {self.limit.limit:.0f}")
            return Rejection(request.request_id, self.cfg.min_retry_after_s, reason, by_limit=True)
        own = self.frame_demand(now, (), (request,))
        capacity = self.capacity.estimate()
        lanes = ((REFUSED_BACKBONE, "the backbone", demand.backbone, own.backbone, capacity.backbone_frames_per_s),
                 (REFUSED_CODEC, "the codec", demand.codec, own.codec, capacity.codec_frames_per_s))
        for key, lane, lane_demand, own_demand, frames_per_s in lanes[: 2 if self.cfg.codec_admission else 1]:
            for horizon, before, added in zip(self.cfg.demand_horizons_s, lane_demand, own_demand):
                supply = self.cfg.capacity_headroom * frames_per_s * horizon
                if before + added > supply:
                    self.decisions[key] += 1
                    reason = (f"server at capacity: streams in progress need {before + added} frames from {lane} in "
                              f"the next {horizon:.1f} s, it makes ≈ {frames_per_s:.0f} frames/s")
                    retry = max((before + added - supply) / frames_per_s, self.cfg.min_retry_after_s)
                    return Rejection(request.request_id, retry, reason)
        running = sum(not s.generation_done for s in streams)
        # from its arrival, as `shed_waiting` judges it: the time it spent reaching the engine counts against T, or a
        # request accepted here is shed at the next step, its refusal answered a step or more later
        first_audio = max(now - request.arrival_time, 0.0) + self.first_audio_s(request, running, len(waiting))
        if first_audio > self.cfg.ttfa_target_s:
            self.decisions[REFUSED_FIRST_AUDIO] += 1
            reason = (f"server at capacity: first audio predicted {first_audio * 1000:.0f} ms after arrival "
                      f"(target {self.cfg.ttfa_target_s * 1000:.0f} ms)")
            return Rejection(request.request_id, self.cfg.min_retry_after_s, reason)
        demand.add(own)  # until the next refresh counts it
        self.decisions[ACCEPTED] += 1
        return None

    def shed_waiting(self, now: float, waiting: Sequence[WaitingRequest], running: int) -> list[Rejection]:
        """Waiting requests that can no longer meet T, given `running` requests decoding beside them."""
        if not self.enabled:
            return []
        doomed = []
        for ahead, request in enumerate(waiting):
            ready_at = now + self.first_audio_s(request, running, ahead)
            if ready_at > chunk_deadline(self.schedule, 0, request.arrival_time, self.cfg.ttfa_target_s, None):
                reason = f"could not start audio within {self.cfg.ttfa_target_s * 1000:.0f} ms under current load"
                doomed.append(Rejection(request.request_id, self.cfg.min_retry_after_s, reason))
        return doomed  # counted by the caller, which may still admit them (an idle server sheds nothing)

    def demand_shares(self) -> tuple[float, float] | None:
        """(backbone, codec): the largest share, over the horizons, of each lane's frame rate that the last counted
        demand needs (admission refuses past `capacity_headroom`); None before any arrival was checked."""
        if self._demand is None:
            return None
        estimate = self.capacity.estimate()
        horizons = self.cfg.demand_horizons_s

        def share(demand: list[int], frames_per_s: float) -> float:
            return max(d / (frames_per_s * h) for d, h in zip(demand, horizons))

        return (share(self._demand.backbone, estimate.backbone_frames_per_s),
                share(self._demand.codec, estimate.codec_frames_per_s))

    def take_decisions(self) -> Counter[str]:
        """The counts since the last call (for a periodic log line)."""
        decisions, self.decisions = self.decisions, Counter()
        return decisions
