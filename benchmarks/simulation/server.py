"""A discrete-event model of one GPU serving Qwen3-TTS with three lanes, driven by the real policy (`Planner`).

- LM lane: one step = the admitted prefills (packed, whole GPU), then one decode step of the chosen requests (LM
  partition). A prefill yields the request's first frame; each decode step one more frame per chosen request.
- Urgent lane: whole GPU at high priority; its batches also slow the LM step in flight by `urgent_interference` of
  their duration (assumed: the paper only says the urgent lane runs "beside" the others), and the next background
  batch by `urgent_codec_interference` of it.
- Background lane: the codec partition beside the backbone; it does not slow the LM (the LM's seed cost is already
  measured on its partition, paper §2.3 O1).
- Costs come from a `CostSeed` (`paper_h100_seed`: its docstring states the sources and the assumptions) with 5%
  log-normal jitter; the planner sees only the durations the "GPU" took, as cost samples in a `StepReport`.
- `host_overhead_s` adds host time to every LM step that the cost samples do not carry (on a GPU the planner learns
  device times; the host gap shows only in the step interval).
- `host_per_codec_batch_s` adds host time to the next LM step for every codec batch, whatever its size (the
  served pump's launch and hand-over; on the H200 small background batches cost 1.4-1.7x more host time a frame
  than full ones, 2026-12-04_9d9481d).
- `handover_at_step`: a codec batch that finishes while an LM step runs hands its audio over only when that step
  ends, as the served worker collects finished batches once a step after the step's forward (on the H200 a first
  chunk took p50 15-31 ms from its cut to its audio, where its decode took about 2 ms, 2026-12-04_4af55f2). The
  urgent lane (one batch in flight) takes no other batch until then; the background lane queues its next batch
  behind the running one, so it is free at once. Off: audio leaves when its batch ends. Either way each first
  audio's time from its chunk's last frame to its audio goes to the planner in the step report, as the served
  worker reports it.
- `codec_at_step`: codec batches launch only between LM steps, as the served worker plans and launches the lanes
  once a step after its forward; off, whenever a lane is free and the policy says so.
- `background_buckets`: the batch sizes of the background lane's graphs; a batch costs the smallest at least its
  size, as the served lane pads its rows up to a graph (the cost sample keeps the batch's own size, as the served
  worker reports it); empty, each batch costs its own size.
- Not modelled: HTTP and transport latency, the prefill's effect on the background lane, KV-cache limits.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from benchmarks.simulation.slo import RequestOutcome
from benchmarks.simulation.workload import SimRequest
from vllm_voxserve.models.batch_sizes import smallest_at_least
from vllm_voxserve.scheduler.costs import CostModel, CostSeed, paper_h100_seed
from vllm_voxserve.scheduler.overload import SHED_WAITING
from vllm_voxserve.scheduler.planner import Planner
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.contract import CostSample, LaneBacklog, StepReport
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest, schedule_of
from vllm_voxserve.scheduler.urgency import ReadyChunk


@dataclass(frozen=True, slots=True)
class GpuModel:
    seed: CostSeed = field(default_factory=paper_h100_seed)
    jitter: float = 0.05  # sd of log(actual / seed) per execution
    urgent_interference: float = 0.5
    # the same for the background codec lane: the urgent lane's whole-GPU kernels go first on the codec partition's
    # SMs too (assumed: the share is not measured)
    urgent_codec_interference: float = 0.0
    # host time between two LM steps (scheduling, input preparation, output processing) that no device timer sees:
    # it lengthens the step interval but not the decode cost samples
    host_overhead_s: float = 0.0
    # host time a step per decoded request (input preparation and output processing grow with the batch): the part
    # of the step the cost model does not see and that grows with load
    host_per_row_s: float = 0.0
    # host time of each codec batch (launch and hand-over of its audio), on the engine's thread, so it lengthens the
    # next LM step: what makes small background batches cost host time that full ones share
    host_per_codec_batch_s: float = 0.0
    handover_at_step: bool = False  # audio of a codec batch leaves at the end of the LM step it finished in
    codec_at_step: bool = False  # codec batches launch only between LM steps (the served pump runs once a step)
    background_buckets: tuple[int, ...] = ()  # the background lane's graph sizes a batch pads up to; () no padding


@dataclass(order=True, slots=True)
class _Event:
    time: float
    order: int
    kind: str = field(compare=False)
    payload: object = field(compare=False, default=None)


class SimulatedServer:
    def __init__(self, cfg: SchedulerPolicyConfig, gpu: GpuModel | None = None, seed: int = 0) -> None:
        self.cfg = cfg
        self.gpu = gpu or GpuModel()
        self.rng = random.Random(seed)
        self.planner = Planner(cfg, CostModel(self.gpu.seed))
        self.schedule = schedule_of(cfg)
        self.events: list[_Event] = []
        self.counter = 0
        self.waiting: list[WaitingRequest] = []
        self.streams: dict[str, StreamState] = {}
        self.true_frames: dict[str, int] = {}
        self.outcomes: dict[str, RequestOutcome] = {}
        self.lanes = LaneBacklog()
        self.lm_busy = False
        self.lm_debt_s = 0.0
        self.background_debt_s = 0.0
        self.prefill_deferrals = 0
        self.codec_batches: Counter[str] = Counter()  # per lane: batches launched and the chunks they carried
        self.pending_wake: float | None = None
        self.samples: list[CostSample] = []
        self.first_ready: dict[str, float] = {}  # when each request's first chunk had all its frames
        self.handovers: list[float] = []  # first chunks' way to audio since the last report
        self.held: list[tuple[str, list[ReadyChunk]]] = []  # finished batches waiting for the LM step's end

    # -- event plumbing ------------------------------------------------------------------------------------------
    def _push(self, time: float, kind: str, payload: object = None) -> None:
        self.counter += 1
        heapq.heappush(self.events, _Event(time, self.counter, kind, payload))

    def _run_cost(self, kind: str, size: int) -> float:
        padded = kind == "background_codec" and self.gpu.background_buckets
        run = smallest_at_least(self.gpu.background_buckets, size) if padded else size
        seconds = getattr(self.gpu.seed, kind)(run) * math.exp(self.rng.gauss(0.0, self.gpu.jitter))
        self.samples.append(CostSample(kind, size, seconds))
        return seconds

    def run(self, requests: Sequence[SimRequest], horizon_s: float) -> list[RequestOutcome]:
        for request in requests:
            self.outcomes[request.request_id] = RequestOutcome(request.request_id, request.arrival_time)
            self._push(request.arrival_time, "arrival", request)
        while self.events and self.events[0].time <= horizon_s:
            now = self.events[0].time
            while self.events and self.events[0].time == now:
                event = heapq.heappop(self.events)
                getattr(self, f"_on_{event.kind}")(now, event.payload)
            self._dispatch(now)
        return [self.outcomes[r.request_id] for r in requests]

    # -- events ----------------------------------------------------------------------------------------------------
    def _on_arrival(self, now: float, request: SimRequest) -> None:
        waiting = WaitingRequest(request.request_id, now, request.prompt_tokens, request.expected_frames)
        self.true_frames[request.request_id] = request.frames
        if self.planner.on_arrival(now, waiting, list(self.streams.values()), self.waiting) is not None:
            self.outcomes[request.request_id].rejected = True
            return
        self.waiting.append(waiting)

    def _on_wake(self, now: float, payload: object) -> None:
        if self.pending_wake is not None and self.pending_wake <= now:
            self.pending_wake = None

    def _on_lm_done(self, now: float, step: tuple[list[str], list[str]]) -> None:
        admitted, decoded = step
        for request_id in admitted:
            self._add_frame(now, request_id)
        for request_id in decoded:
            self._add_frame(now, request_id)
        self.lm_busy = False
        held, self.held = self.held, []
        for lane, batch in held:
            self._hand_over(now, lane, batch)

    def _add_frame(self, now: float, request_id: str) -> None:
        stream = self.streams[request_id]
        stream.frames_generated += 1
        stream.generation_done = stream.frames_generated >= self.true_frames[request_id]
        if stream.frames_generated == self.cfg.first_chunk_frames or (
                stream.generation_done and stream.frames_generated < self.cfg.first_chunk_frames):
            self.first_ready[request_id] = now

    def _on_urgent_done(self, now: float, batch: list[ReadyChunk]) -> None:
        if self.gpu.handover_at_step and self.lm_busy:
            self.held.append(("urgent", batch))
        else:
            self._hand_over(now, "urgent", batch)

    def _on_background_done(self, now: float, batch: list[ReadyChunk]) -> None:
        self.lanes.background_busy = False
        if self.gpu.handover_at_step and self.lm_busy:
            self.held.append(("background", batch))
        else:
            self._deliver(now, batch)

    def _hand_over(self, now: float, lane: str, batch: list[ReadyChunk]) -> None:
        if lane == "urgent":
            self.lanes.urgent_busy = False
        self._deliver(now, batch)

    def _deliver(self, now: float, batch: list[ReadyChunk]) -> None:
        for chunk in batch:
            stream = self.streams[chunk.request_id]
            stream.chunk_in_flight = False
            stream.chunks_delivered += 1
            if stream.first_audio_time is None:
                stream.first_audio_time = now
                ready = self.first_ready.pop(chunk.request_id, None)
                if ready is not None:
                    self.handovers.append(now - ready)
            outcome = self.outcomes[chunk.request_id]
            outcome.audio.append((now, chunk.frames * self.cfg.frame_duration_s))
            if stream.generation_done and stream.chunks_delivered == self.schedule.num_chunks(stream.frames_generated):
                outcome.completed = True
                outcome.completed_at = now
                del self.streams[chunk.request_id]

    # -- one scheduling round ----------------------------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        self.planner.observe(StepReport(now, costs=self.samples, first_audio_handovers=self.handovers))
        self.samples, self.handovers = [], []
        plan = self.planner.plan_step(now, list(self.streams.values()), self.waiting, self.lanes, not self.lm_busy)
        rejected = {r.request_id for r in plan.reject}
        self.planner.overload.decisions[SHED_WAITING] += len(rejected)
        for request_id in rejected:
            self.outcomes[request_id].rejected = True
        if plan.admit or rejected:
            admitted = set(plan.admit)
            for request in self.waiting:
                if request.request_id in admitted:
                    self.streams[request.request_id] = StreamState.admitted(request)
            self.waiting = [w for w in self.waiting if w.request_id not in admitted | rejected]
        self.prefill_deferrals += plan.prefill_deferred
        codec_now = not (self.gpu.codec_at_step and self.lm_busy)  # else the chunks wait for the step's end
        if plan.urgent and codec_now:
            self._launch_codec(now, plan.urgent, "urgent_codec", "urgent_done")
            self.lanes.urgent_busy = True
        if plan.background and codec_now:
            self._launch_codec(now, plan.background, "background_codec", "background_done")
            self.lanes.background_busy = True
        if not self.lm_busy:
            self._launch_lm(now, plan.admit, plan.decode)
        if plan.wake_at is not None:
            at = max(plan.wake_at, now + 1e-6)
            if self.pending_wake is None or at < self.pending_wake:
                self.pending_wake = at
                self._push(at, "wake")

    def _launch_codec(self, now: float, batch: list[ReadyChunk], kind: str, done: str) -> None:
        for chunk in batch:
            self.streams[chunk.request_id].chunk_in_flight = True
        lane = kind.removesuffix("_codec")
        self.codec_batches[f"{lane}_batches"] += 1
        self.codec_batches[f"{lane}_chunks"] += len(batch)
        seconds = self._run_cost(kind, len(batch))
        self.lm_debt_s += self.gpu.host_per_codec_batch_s
        if kind == "urgent_codec" and self.lm_busy:
            self.lm_debt_s += self.gpu.urgent_interference * seconds
        if kind == "urgent_codec" and self.lanes.background_busy:
            self.background_debt_s += self.gpu.urgent_codec_interference * seconds
        if kind == "background_codec":
            seconds += self.background_debt_s
            self.background_debt_s = 0.0
        self._push(now + seconds, done, batch)

    def _launch_lm(self, now: float, admit: list[str], decode: list[str]) -> None:
        seconds = 0.0
        if admit:
            seconds += self._run_cost("prefill", sum(self.streams[r].prompt_tokens for r in admit))
        if decode:
            seconds += self._run_cost("decode", len(decode)) + self.gpu.host_per_row_s * len(decode)
        if seconds == 0.0:
            return
        seconds += self.lm_debt_s + self.gpu.host_overhead_s
        self.lm_debt_s = 0.0
        self.lm_busy = True
        self._push(now + seconds, "lm_done", (list(admit), list(decode)))
