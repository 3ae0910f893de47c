"""Which running requests a decode step takes when more run than one decode batch holds (paper §4.7).

- deadline_aware: least slack first, so a new request waiting for its first chunk goes ahead of requests with audio
  buffered. A request left out loses slack with every step it waits while the chosen ones keep theirs, so none
  starves.
- prefill_first: arrival order, as the paper's baseline (the newest requests are left out).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.slack import generating
from vllm_voxserve.scheduler.streams import StreamState


def decode_order(
    streams: Iterable[StreamState], slack: Mapping[str, float], cfg: SchedulerPolicyConfig
) -> list[str]:
    """Request ids for the next decode step, at most `max_decode_batch`; `slack` by request id (see `slack.slacks`)."""
    active = sorted(generating(streams), key=lambda s: (s.arrival_time, s.request_id))
    if cfg.deadline_aware and len(active) > cfg.max_decode_batch:
        active.sort(key=lambda s: slack[s.request_id])  # stable: ties keep arrival order
    return [s.request_id for s in active[: cfg.max_decode_batch]]
