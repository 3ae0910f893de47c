"""The `lanes` codec mode on the worker: ready chunks go to the codec lanes, as the pure policy decides (paper §3.2).

The worker keeps each request's playback timeline as the policy's `StreamState`: frames generated, chunks delivered,
whether one is in flight, and when its first audio left (that starts playback; chunk k's deadline is when the audio
before it runs out). At every engine step (`pump`) it harvests finished codec batches, then asks the planner which
ready chunks are urgent (a first chunk, or a deadline within δu: urgent lane, at once) and whether the background
batch launches (≥ B ready, the earliest deadline approaching, or nothing left generating), and submits that.

The lane manager keeps a request's chunks in order (its next chunk goes only after the previous one finished), so
audio leaves in order. A finished request's END follows its last chunk's audio. When no request is left generating,
the engine may take no further step, so `finish` then drains the lanes (blocking) instead of waiting for a pump.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from vllm_voxserve.codec_lanes import (
    BatchCost,
    CodecChunk,
    FinishedChunk,
    LaneConfig,
    LaneKind,
    LaneManager,
    SplitSpec,
    cpu_partitions,
    shared_partitions,
)
from vllm_voxserve.config import LaneExecutables, VoxServeConfig
from vllm_voxserve.contract import CostSample, LaneBacklog, StepReport
from vllm_voxserve.models.batch_sizes import smallest_at_least
from vllm_voxserve.models.program import CodecProgram
from vllm_voxserve.scheduler import Planner, StreamState
from vllm_voxserve.scheduler.urgency import ReadyChunk

logger = logging.getLogger(__name__)

_COST_KIND = {LaneKind.URGENT: "urgent_codec", LaneKind.BACKGROUND: "background_codec"}


@dataclass(slots=True)
class _Request:
    state: StreamState  # the policy's view: frames, chunks delivered / in flight, first audio time
    queue: deque[CodecChunk] = field(default_factory=deque)  # cut chunks not yet submitted, in order


class LaneDispatch:
    """Chunks -> codec lanes -> `deliver(request_id, audio)`; `ended(request_id, error)` after a finished request's
    last audio (error None) or when its chunks cannot be decoded. `clock` is the monotonic clock of the playback
    timelines (injectable for tests)."""

    def __init__(self, program: CodecProgram, config: VoxServeConfig, device: torch.device,
                 deliver: Callable[[str, torch.Tensor], None], ended: Callable[[str, str | None], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deliver, self.ended, self.clock = deliver, ended, clock
        policy = config.scheduler_policy().replace(frame_duration_s=1.0 / program.frame_rate_hz)  # the codec's
        self.planner = Planner(policy)
        lanes = config.lanes
        # every executable field as configured, so that a new one cannot be left behind here
        lane_config = LaneConfig(max_requests=config.max_codec_slots,
                                 **{f.name: getattr(lanes, f.name) for f in fields(LaneExecutables)})
        if device.type == "cuda":
            partitions = shared_partitions(SplitSpec(lanes.split.group, lanes.split.group_sms, device.index or 0))
        else:
            partitions = cpu_partitions()
        self.manager = LaneManager(program, partitions, lane_config, self._on_chunk)
        self.frame_counts = tuple(sorted(lanes.frame_counts))
        self.requests: dict[str, _Request] = {}
        self.queued_chunks = 0  # cut chunks waiting for a lane, over all requests (the step log's backlog)
        # harvested batches for the step log, which empties it (bounded: a caller that never reads it keeps only the
        # newest)
        self.harvested: deque[BatchCost] = deque(maxlen=4096)
        # the same batches as cost samples for the engine's scheduler, whose admission weighs the codec lane's frame
        # rate (the worker's step report carries them; bounded like `harvested`)
        self.cost_samples: deque[CostSample] = deque(maxlen=4096)
        # host seconds of the pumps since the step log last read them, by part: harvest (finished batches to host
        # tensors), deliver (their audio sent, ENDs), plan, launch, and drain (a blocking pump's harvest, waits
        # included). Run 2026-12-01_530eabc on the H200: the harvest with delivery was the pump's tail (p99 7-13 ms a
        # step against 15-165 us at the median, 40-48 req/s); delivery is now apart, to say which it is.
        self.pump_seconds = dict.fromkeys(("harvest", "deliver", "plan", "launch", "drain"), 0.0)

    # request lifecycle -------------------------------------------------------------------------------------------

    def open(self, request_id: str, warmup_codes: torch.Tensor | None = None) -> None:
        self.manager.open_request(request_id)  # RuntimeError when no state slot is free
        if warmup_codes is not None and len(warmup_codes):
            try:
                self.manager.prime(request_id, warmup_codes)  # clamped by the pipeline (`AudioPipeline.open`)
            except BaseException:
                self.manager.close_request(request_id)
                raise
        self.requests[request_id] = _Request(StreamState(request_id, arrival_time=self.clock()))

    def add_frames(self, request_id: str, count: int) -> None:
        self.requests[request_id].state.frames_generated += count

    def add_chunk(self, request_id: str, chunk_index: int, codes: torch.Tensor, is_last: bool = False) -> None:
        """A cut chunk (all its frames exist): it waits here until the policy sends it to a lane."""
        req = self.requests[request_id]
        req.queue.append(CodecChunk(request_id, chunk_index, codes, is_last))
        self.queued_chunks += 1

    def finish(self, request_id: str) -> None:
        """The request generates no more frames (its last chunk, if any, was added with is_last)."""
        req = self.requests.get(request_id)
        if req is None:
            return
        req.state.generation_done = True
        if not req.queue and not req.state.chunk_in_flight:
            self._end(request_id)
        self.settle()

    def settle(self) -> None:
        """After a request left the generating set: drain when none is left generating, since the engine may take
        no further step. Otherwise the engine steps again and its step pumps: a pump here for each finished request
        cost 2.4 % of the engine thread at 60 req/s on the H200 (run 2026-12-01_a7fe391's host profile)."""
        if all(r.state.generation_done for r in self.requests.values()):
            self.drain()

    def abort(self, request_id: str) -> None:
        """Drop the request: queued chunks are forgotten, the audio of one in flight is discarded."""
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.queued_chunks -= len(req.queue)
            self.manager.close_request(request_id)

    @property
    def busy(self) -> bool:
        """A request is open, or a lane still holds a batch (maybe of an aborted request)."""
        return bool(self.requests) or not all(self.manager.is_idle(k) for k in LaneKind)

    # scheduling --------------------------------------------------------------------------------------------------

    def pump(self, block: bool = False) -> bool:
        """One scheduling round: harvest, launch what the policy says, harvest again (a CPU lane has finished by
        then). `block` waits for batches in flight first. Returns whether anything was harvested or launched."""
        delivering = self.pump_seconds["deliver"]
        started = time.perf_counter()
        progress = self._harvest(block)
        harvested = time.perf_counter()
        progress |= self._launch()
        launched = time.perf_counter()
        progress |= self._harvest(False)
        seconds = harvested - started + time.perf_counter() - launched
        self.pump_seconds["drain" if block else "harvest"] += seconds - (self.pump_seconds["deliver"] - delivering)
        return progress

    def drain(self) -> None:
        """Decode and deliver everything of finished requests, blocking; only when none is generating."""
        while any(r.state.generation_done for r in self.requests.values()):
            if not self.pump(block=True):
                stuck = [rid for rid, r in self.requests.items() if r.state.generation_done]
                logger.error("codec lanes made no progress draining %s; ending them with an error", stuck)
                for rid in stuck:
                    self.abort(rid)
                    self.ended(rid, "codec lanes stalled")
                return
        if not self.requests:
            self.manager.drain()  # batches of aborted requests: free their slots

    def _harvest(self, block: bool) -> bool:
        delivered = self.manager.poll(block=block)
        costs = self.manager.take_batch_costs()
        if costs:
            self.harvested.extend(costs)
            samples = [CostSample(_COST_KIND[c.lane], c.size, c.seconds) for c in costs]
            self.planner.observe(StepReport(self.clock(), costs=samples))
            self.cost_samples.extend(samples)
        return bool(delivered or costs)

    def take_cost_samples(self) -> list[CostSample]:
        """The codec batches' cost samples since the last call."""
        samples = list(self.cost_samples)
        self.cost_samples.clear()
        return samples

    def _launch(self) -> bool:
        # a lane is free for the policy while it takes another batch (the background lane queues one behind another)
        urgent_idle = self.manager.can_launch(LaneKind.URGENT)
        background_idle = self.manager.can_launch(LaneKind.BACKGROUND)
        if not (urgent_idle or background_idle) or not self.requests:
            return False
        # only requests with a cut chunk and none in flight can have a ready one: the policy sees just those
        candidates = [r.state for r in self.requests.values() if r.queue and not r.state.chunk_in_flight]
        if not candidates:
            return False
        generating = any(not r.state.generation_done for r in self.requests.values())
        started = time.perf_counter()
        plan = self.planner.plan_step(self.clock(), candidates, [],
                                      LaneBacklog(urgent_busy=not urgent_idle, background_busy=not background_idle),
                                      lm_free=False, lm_has_work=generating)
        batches = [(kind, self._one_executable(chosen))
                   for kind, chosen in ((LaneKind.URGENT, plan.urgent), (LaneKind.BACKGROUND, plan.background))]
        planned = time.perf_counter()
        for kind, chosen in batches:
            if chosen:
                self._submit(kind, chosen[: self.manager.max_batch(kind)])
        self.pump_seconds["plan"] += planned - started
        self.pump_seconds["launch"] += time.perf_counter() - planned
        return any(chosen for _, chosen in batches)

    def _one_executable(self, chosen: list[ReadyChunk]) -> list[ReadyChunk]:
        """The chosen chunks that run in one (bucket, frames) executable, the first (most urgent) always among them.
        A full chunk runs at its own length; a request's last chunk at any prepared length that fits it (its padding
        frames follow its audio and only advance a state nobody reads again), so it joins the batch of full chunks
        where it fits instead of splitting it: with 5- and 10-frame executables, a short last chunk would otherwise
        pull the next batch down to 5-frame chunks and leave the 10-frame ones for another batch."""
        if not chosen:
            return chosen
        is_last = {r.request_id: self.requests[r.request_id].queue[0].is_last for r in chosen}
        first = chosen[0]
        if not is_last[first.request_id]:
            frames = first.frames
        else:  # the first full chunk's length if the last chunk fits it, else the smallest that fits
            full = [r.frames for r in chosen if not is_last[r.request_id] and r.frames >= first.frames]
            frames = full[0] if full else smallest_at_least(self.frame_counts, first.frames)
        return [r for r in chosen if r.frames == frames or (is_last[r.request_id] and r.frames <= frames)]

    def _submit(self, kind: LaneKind, chosen: list[ReadyChunk]) -> None:
        chunks = []
        for ready in chosen:
            req = self.requests[ready.request_id]
            chunk = req.queue[0]
            if chunk.chunk_index != ready.index or chunk.codes.shape[0] != ready.frames:
                raise RuntimeError(f"{ready.request_id}: the policy chose chunk {ready.index} ({ready.frames} frames)"
                                   f" but chunk {chunk.chunk_index} ({chunk.codes.shape[0]} frames) is next")
            chunks.append(chunk)
        self.manager.submit(kind, chunks)
        for ready in chosen:
            req = self.requests[ready.request_id]
            req.queue.popleft()
            self.queued_chunks -= 1
            req.state.chunk_in_flight = True

    def _on_chunk(self, finished: FinishedChunk) -> None:
        req = self.requests.get(finished.request_id)
        if req is None:  # aborted while in flight (the manager drops those itself)
            return
        state = req.state
        state.chunk_in_flight = False
        state.chunks_delivered += 1
        if state.first_audio_time is None:
            state.first_audio_time = self.clock()  # playback starts: later deadlines count from here
        started = time.perf_counter()
        self.deliver(finished.request_id, finished.audio)
        if state.generation_done and not req.queue:
            self._end(finished.request_id)
        self.pump_seconds["deliver"] += time.perf_counter() - started

    def _end(self, request_id: str) -> None:
        self.requests.pop(request_id)
        self.manager.close_request(request_id)  # no-op when its last chunk already released the slot
        self.ended(request_id, None)
