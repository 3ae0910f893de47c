"""Slack of a running request: how long its LM work can wait before its next chunk misses its deadline."""

from __future__ import annotations

from typing import Iterable, Sequence

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import INFINITE_SLACK, StreamState, lm_chunk, schedule_of
from vllm_voxserve.scheduler.timeline import chunk_deadline


class SlackEstimator:
    """Deadline of the chunk being generated, minus now, minus the time to generate its remaining frames and decode
    it (paper §3.2), with the step and codec costs of one planning round. Finished requests have infinite slack."""

    def __init__(self, now: float, decode_batch: int, costs: CostModel, cfg: SchedulerPolicyConfig) -> None:
        self.now = now
        self.cfg = cfg
        self.schedule = schedule_of(cfg)
        self.step_s = costs.decode_step_s(decode_batch)
        self.first_codec_s = costs.urgent_codec_s(1)
        self.later_codec_s = costs.background_codec_s(1)

    def __call__(self, stream: StreamState) -> float:
        if stream.generation_done:
            return INFINITE_SLACK
        chunk = lm_chunk(stream, self.schedule)
        end = self.schedule.end_frame(chunk)
        if stream.expected_frames is not None and stream.expected_frames > stream.frames_generated:
            end = min(end, stream.expected_frames)
        frames_to_go = max(end - stream.frames_generated, 1)
        codec_s = self.first_codec_s if chunk == 0 else self.later_codec_s
        deadline = chunk_deadline(
            self.schedule, chunk, stream.arrival_time, self.cfg.ttfa_target_s, stream.first_audio_time
        )
        return deadline - self.now - frames_to_go * self.step_s - codec_s


def generating(streams: Iterable[StreamState]) -> list[StreamState]:
    return [s for s in streams if not s.generation_done]


def slacks(
    active: Sequence[StreamState], now: float, costs: CostModel, cfg: SchedulerPolicyConfig
) -> dict[str, float]:
    """Slack of each generating request, at the decode batch they make together."""
    if not active:
        return {}
    slack = SlackEstimator(now, min(len(active), cfg.max_decode_batch), costs, cfg)
    return {s.request_id: slack(s) for s in active}


def min_slack(values: Iterable[float], cfg: SchedulerPolicyConfig) -> float:
    """Smallest slack among running requests. Unless `cfg.count_late_requests`, a request already past saving
    (negative slack) is left out: deferring a prefill cannot bring its chunk back in time, and counting it would let
    one late request hold back every prefill behind it."""
    if not cfg.count_late_requests:
        values = [v for v in values if v >= 0]
    return min(values, default=INFINITE_SLACK)
