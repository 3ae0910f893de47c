"""The lane manager: owns the codec lanes, the state pool and its slots.

It takes decisions ("run these chunks on that lane") from the scheduler's policy and
enforces only the invariants the device needs: one batch in flight per lane, and a
request's next chunk dispatched only after its previous one finished, in chunk order.
`poll()` harvests finished batches with CUDA event queries (never a blocking sync) and
hands their audio to the `on_audio` callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vllm_voxserve.codec_lanes.background_lane import make_background_lane
from vllm_voxserve.codec_lanes.codec_lane import CodecChunk, CodecLane, FinishedChunk, LaneKind
from vllm_voxserve.codec_lanes.partitions import Partitions
from vllm_voxserve.codec_lanes.urgent_lane import make_urgent_lane
from vllm_voxserve.config import LaneExecutables
from vllm_voxserve.models.program import CodecProgram

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LaneConfig(LaneExecutables):
    """The lanes' executables (`voxserve.lanes`, their frame counts given) and the state slots for requests."""

    WHERE = "lanes"
    max_requests: int = 256  # state slots for requests (two more are kept as padding slots)

    def __post_init__(self) -> None:
        LaneExecutables.__post_init__(self)  # (zero-argument super() fails in a slots dataclass)
        if not self.frame_counts:
            raise ValueError("lanes.frame_counts must not be empty")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")


class SlotAllocator:
    """Free list of state slots; lowest slot first so tests are deterministic."""

    def __init__(self, num_slots: int, what: str = "codec state slot") -> None:
        self._free = list(range(num_slots - 1, -1, -1))
        self.what = what

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"no free {self.what}")
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def num_free(self) -> int:
        return len(self._free)


@dataclass(frozen=True, slots=True)
class BatchCost:
    """One finished codec batch, for the scheduler's cost model (chunks and seconds on the device) and the step log
    (the rows it ran at, padding included)."""

    lane: LaneKind
    size: int
    seconds: float
    rows: int = 0


@dataclass(slots=True)
class _Request:
    slot: int
    next_chunk: int = 0
    fresh: bool = True  # state not yet reset: reset on the lane that decodes chunk 0
    in_flight: LaneKind | None = None
    closed: bool = False


class LaneManager:
    def __init__(self, program: CodecProgram, partitions: Partitions, config: LaneConfig,
                 on_audio: Callable[[FinishedChunk], None]) -> None:
        self.program, self.partitions, self.config, self.on_audio = program, partitions, config, on_audio
        n = config.max_requests
        self.pool = program.make_state_pool(n + 2, partitions.device)
        self.pool.reset(torch.arange(n + 2, dtype=torch.int64, device=partitions.device))
        self.slots = SlotAllocator(n)
        # Building the lanes compiles the codec (first lane) and captures every graph: most of a GPU server's
        # start-up in run 2026-12-01_530eabc (3.8 of 6.2 minutes), timed here to say which part.
        started = time.perf_counter()
        urgent = make_urgent_lane(program, self.pool, partitions, config.frame_counts, n, config.use_graphs,
                                  config.urgent_buckets)
        built = time.perf_counter()
        background = make_background_lane(program, self.pool, partitions, config.frame_counts, n + 1,
                                          config.use_graphs, config.background_max_batch, config.background_depth,
                                          config.background_bucket_step)
        self.lanes: dict[LaneKind, CodecLane] = {LaneKind.URGENT: urgent, LaneKind.BACKGROUND: background}
        logger.info("codec lanes built in %.1f s: urgent lane %d executables in %.1f s (the codec's compile included), "
                    "background lane %d x %d in %.1f s", time.perf_counter() - started,
                    len(urgent.executables.keys()), built - started, background.depth,
                    len(background.executables.keys()), time.perf_counter() - built)
        self._requests: dict[str, _Request] = {}
        self._costs: list[BatchCost] = []

    def open_request(self, request_id: str) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id} is already open")
        self._requests[request_id] = _Request(self.slots.allocate())

    @torch.no_grad()
    def prime(self, request_id: str, codes: torch.Tensor) -> None:
        """Decode codes int64 [F, Q] into a just-opened request's state and drop the audio (a voice-cloning
        reference that the generated audio continues). Eager, on the urgent stream; waits for it to finish."""
        req = self._requests.get(request_id)
        if req is None or req.closed or req.next_chunk or req.in_flight is not None:
            raise ValueError(f"request {request_id} is not freshly open")
        device = self.partitions.device
        slots = torch.tensor([req.slot], dtype=torch.int64, device=device)
        stream = self.partitions.urgent_stream
        if stream is None:
            self.pool.reset(slots)
            self.program.decode(codes.to(device)[None], slots, self.pool)
        else:
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                self.pool.reset(slots)
                self.program.decode(codes.to(device)[None], slots, self.pool)
            stream.synchronize()
        req.fresh = False

    def close_request(self, request_id: str) -> None:
        """Forget a request (abort or finish). Idempotent. A chunk still in flight finishes,
        its audio is dropped, and only then is the slot reused."""
        req = self._requests.get(request_id)
        if req is None:
            return
        if req.in_flight is None:
            self._release(request_id)
        else:
            req.closed = True

    def can_dispatch(self, request_id: str) -> bool:
        """True when the request is open and has no chunk in flight."""
        req = self._requests.get(request_id)
        return req is not None and req.in_flight is None and not req.closed

    def is_idle(self, kind: LaneKind) -> bool:
        """No batch in flight on that lane."""
        return self.lanes[kind].is_idle()

    def can_launch(self, kind: LaneKind) -> bool:
        """That lane takes another batch now (fewer than its depth in flight)."""
        return self.lanes[kind].can_launch()

    def max_batch(self, kind: LaneKind) -> int:
        return self.lanes[kind].max_batch

    def submit(self, kind: LaneKind, chunks: Sequence[CodecChunk]) -> None:
        """Run these chunks as one batch on that lane (asynchronous on CUDA)."""
        lane = self.lanes[kind]
        if not lane.can_launch():
            raise RuntimeError(f"{kind.value} lane is busy; submit after poll() frees it")
        if len({c.request_id for c in chunks}) != len(chunks):
            raise ValueError("a batch holds at most one chunk per request")
        for c in chunks:
            req = self._requests.get(c.request_id)
            if req is None or req.closed:
                raise ValueError(f"request {c.request_id} is not open")
            if req.in_flight is not None:
                raise ValueError(f"request {c.request_id} has a chunk in flight on the {req.in_flight.value} lane")
            if c.chunk_index != req.next_chunk:
                raise ValueError(f"request {c.request_id}: chunk {c.chunk_index} submitted, {req.next_chunk} expected")
        reqs = [self._requests[c.request_id] for c in chunks]
        lane.launch(chunks, [r.slot for r in reqs], [r.slot for r in reqs if r.fresh])
        for r in reqs:
            r.in_flight, r.fresh, r.next_chunk = kind, False, r.next_chunk + 1

    def poll(self, block: bool = False) -> int:
        """Harvest finished batches and deliver their audio; returns the number of chunks delivered."""
        delivered = 0
        for lane in self.lanes.values():
            while (finished := lane.harvest(block=block)) is not None:
                delivered += self._deliver(lane, finished)
        return delivered

    def _deliver(self, lane: CodecLane, finished: list[FinishedChunk]) -> int:
        delivered = 0
        if finished:
            self._costs.append(BatchCost(lane.kind, len(finished), lane.last_batch_seconds, lane.last_batch_rows))
        for chunk in finished:
            req = self._requests[chunk.request_id]
            req.in_flight = None
            if req.closed or chunk.is_last:
                self._release(chunk.request_id)
            if not req.closed:
                self.on_audio(chunk)
                delivered += 1
        return delivered

    def take_batch_costs(self) -> list[BatchCost]:
        """Costs of the batches harvested since the last call."""
        costs, self._costs = self._costs, []
        return costs

    def drain(self) -> int:
        """Block until no lane has a batch in flight (tests and shutdown)."""
        return self.poll(block=True)

    def _release(self, request_id: str) -> None:
        self.slots.free(self._requests.pop(request_id).slot)

