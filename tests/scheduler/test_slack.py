"""Slack of a generating request (paper §3.2), against the chunk schedule's own arithmetic."""

from __future__ import annotations

import math
import random

import pytest

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.slack import SlackEstimator, min_slack, slacks
from vllm_voxserve.scheduler.streams import StreamState, lm_chunk, schedule_of
from vllm_voxserve.scheduler.timeline import chunk_deadline


def reference_slack(stream: StreamState, now: float, estimator: SlackEstimator, cfg: SchedulerPolicyConfig) -> float:
    """The definition, through `ChunkSchedule` and `chunk_deadline` (which the estimator inlines for speed)."""
    if stream.generation_done:
        return math.inf
    schedule = schedule_of(cfg)
    chunk = lm_chunk(stream, schedule)
    end = schedule.end_frame(chunk)
    if stream.expected_frames is not None and stream.expected_frames > stream.frames_generated:
        end = min(end, stream.expected_frames)
    codec_s = estimator.first_codec_s if chunk == 0 else estimator.later_codec_s
    deadline = chunk_deadline(schedule, chunk, stream.arrival_time, cfg.ttfa_target_s, stream.first_audio_time)
    return deadline - now - max(end - stream.frames_generated, 1) * estimator.step_s - codec_s


@pytest.mark.parametrize("cfg", [SchedulerPolicyConfig(),
                                 SchedulerPolicyConfig(first_chunk_frames=5, chunk_frames=10, ttfa_target_s=0.15)])
def test_the_estimator_agrees_with_the_schedule_on_random_streams(cfg):
    rng = random.Random(1)
    estimator = SlackEstimator(3.0, 48, CostModel(), cfg)
    streams = [StreamState(f"r{i}", rng.uniform(0, 3), frames_generated=rng.randint(0, 120),
                           expected_frames=None if rng.random() < 0.3 else rng.randint(1, 130),
                           generation_done=rng.random() < 0.1,
                           first_audio_time=None if rng.random() < 0.3 else rng.uniform(1, 3)) for i in range(500)]
    got = [estimator(s) for s in streams]
    assert got == pytest.approx([reference_slack(s, 3.0, estimator, cfg) for s in streams])
    assert any(math.isinf(v) for v in got) and any(v < 0 for v in got) and any(0 < v < math.inf for v in got)


def test_slacks_cover_the_generating_requests_and_min_slack_skips_the_lost_ones():
    cfg = SchedulerPolicyConfig()
    streams = [StreamState("late", 0.0, frames_generated=3), StreamState("fine", 0.9, frames_generated=3)]
    values = slacks(streams, 1.0, CostModel(), cfg)
    assert set(values) == {"late", "fine"} and values["late"] < 0 < values["fine"]
    assert min_slack(values.values()) == values["fine"]


def test_a_waiting_request_has_until_its_first_chunk_deadline_less_its_prefill_frames_and_decode():
    from tests.scheduler.steps import waiting
    from vllm_voxserve.scheduler.slack import waiting_slack

    cfg, costs = SchedulerPolicyConfig(first_chunk_frames=5), CostModel()
    request = waiting("w", arrival=1.0, tokens=40)
    want = 1.0 + 0.2 - 1.03 - costs.prefill_s(40) - 5 * costs.decode_step_s(64) - costs.urgent_codec_s(1)
    assert waiting_slack(request, 1.03, 64, costs, cfg) == pytest.approx(want)
    assert waiting_slack(request, 1.04, 64, costs, cfg) == pytest.approx(want - 0.01)  # waiting spends it
