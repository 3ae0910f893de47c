"""Slack of a running request: how long its LM work can wait before its next chunk misses its deadline."""

from __future__ import annotations

from typing import Iterable

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import INFINITE_SLACK, StreamState, lm_chunk, schedule_of


def stream_slack(
    stream: StreamState, now: float, decode_batch: int, costs: CostModel, cfg: SchedulerPolicyConfig
) -> float:
    """Deadline of the chunk being generated, minus now, minus the time to generate its remaining frames and
    decode it (paper §3.2). A request that has generated everything has infinite slack on the LM."""
    if stream.generation_done:
        return INFINITE_SLACK
    schedule = schedule_of(cfg)
    chunk = lm_chunk(stream, schedule)
    end = schedule.end_frame(chunk)
    if stream.expected_frames is not None and stream.expected_frames > stream.frames_generated:
        end = min(end, stream.expected_frames)
    frames_to_go = max(end - stream.frames_generated, 1)
    codec_s = costs.urgent_codec_s(1) if chunk == 0 else costs.background_codec_s(1)
    finish = frames_to_go * costs.decode_step_s(decode_batch) + codec_s
    return stream.timeline(cfg).deadline(chunk) - now - finish


def generating(streams: Iterable[StreamState]) -> list[StreamState]:
    return [s for s in streams if not s.generation_done]


def min_slack(
    streams: Iterable[StreamState], now: float, costs: CostModel, cfg: SchedulerPolicyConfig
) -> float:
    active = generating(streams)
    if not active:
        return INFINITE_SLACK
    batch = min(len(active), cfg.max_decode_batch)
    return min(stream_slack(s, now, batch, costs, cfg) for s in active)
