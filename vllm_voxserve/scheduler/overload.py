"""Load shedding past capacity, explainable to users (overload_mode="reject").

The LM lane is the bottleneck past capacity. Its capacity is estimated in frames per second from measured step costs
(full decode batches), and each request's LM work in seconds as its prefill plus its expected frames at that rate.

- At arrival: reject (HTTP 503 with Retry-After) when the LM work already admitted plus this request's would take
  more than `backlog_horizon_s` to finish. Retry-After is how long the excess takes to drain.
- While waiting: reject a request that can no longer reach its first audio within T (its prefill, first chunk and
  urgent codec call no longer fit before arrival + T): serving it late would cost running streams their deadlines
  and still miss.

Admission stays below what the server can sustain, so running streams keep their slack, prefills are rarely
deferred, and goodput past capacity stays near its peak instead of collapsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest


@dataclass(frozen=True, slots=True)
class Rejection:
    request_id: str
    retry_after_s: float
    reason: str


class OverloadGuard:
    def __init__(self, cfg: SchedulerPolicyConfig, costs: CostModel) -> None:
        self.cfg = cfg
        self.costs = costs

    @property
    def enabled(self) -> bool:
        return self.cfg.overload_mode == "reject"

    def capacity_frames_per_s(self) -> float:
        return self.costs.lm_frames_per_s(self.cfg.max_decode_batch)

    def request_cost_s(self, request: WaitingRequest) -> float:
        frames = request.expected_frames or self.cfg.default_expected_frames
        return self.costs.request_lm_s(request.prompt_tokens, frames, self.cfg.max_decode_batch)

    def backlog_s(self, streams: Iterable[StreamState], waiting: Iterable[WaitingRequest]) -> float:
        """Seconds of LM work admitted and not yet done."""
        rate = self.capacity_frames_per_s()
        running = sum(s.remaining_frames(self.cfg) for s in streams) / rate
        return running + sum(self.request_cost_s(w) for w in waiting)

    def check_arrival(
        self, request: WaitingRequest, streams: Iterable[StreamState], waiting: Iterable[WaitingRequest]
    ) -> Rejection | None:
        if not self.enabled:
            return None
        backlog = self.backlog_s(streams, waiting)
        cost = self.request_cost_s(request)
        excess = backlog + cost - self.cfg.backlog_horizon_s
        if excess <= 0:
            return None
        reason = (
            f"server at capacity: {backlog:.2f} s of admitted speech generation plus {cost:.2f} s for this request "
            f"exceeds {self.cfg.backlog_horizon_s:.2f} s (capacity ≈ {self.capacity_frames_per_s():.0f} frames/s)"
        )
        return Rejection(request.request_id, max(excess, self.cfg.min_retry_after_s), reason)

    def shed_waiting(
        self, now: float, waiting: Sequence[WaitingRequest], running: int
    ) -> list[Rejection]:
        """Waiting requests that can no longer meet T, given `running` requests decoding beside them."""
        if not self.enabled:
            return []
        batch = min(max(running, 1), self.cfg.max_decode_batch)
        first_chunk_s = self.cfg.first_chunk_frames * self.costs.decode_step_s(batch) + self.costs.urgent_codec_s(1)
        doomed = []
        for request in waiting:
            ready_at = now + self.costs.prefill_s(request.prompt_tokens) + first_chunk_s
            if ready_at > request.arrival_time + self.cfg.ttfa_target_s:
                reason = f"could not start audio within {self.cfg.ttfa_target_s * 1000:.0f} ms under current load"
                doomed.append(Rejection(request.request_id, self.cfg.min_retry_after_s, reason))
        return doomed
