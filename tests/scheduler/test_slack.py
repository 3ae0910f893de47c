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


def test_the_steps_measured_overhead_counts_once_for_every_frame_still_to_make():
    from tests.scheduler.steps import waiting
    from vllm_voxserve.scheduler.slack import waiting_slack

    cfg, costs = SchedulerPolicyConfig(first_chunk_frames=5), CostModel()
    request = waiting("w", arrival=1.0, tokens=40)
    assert waiting_slack(request, 1.03, 64, costs, cfg, overhead_s=0.004) == pytest.approx(
        waiting_slack(request, 1.03, 64, costs, cfg) - 5 * 0.004)
    first_chunk = StreamState("r", 0.9, frames_generated=3)  # 2 frames to go
    later_chunk = StreamState("s", 0.5, frames_generated=12, first_audio_time=0.7)  # 3 frames to go
    for stream, to_go in ((first_chunk, 2), (later_chunk, 3)):
        plain, loaded = SlackEstimator(1.0, 48, costs, cfg), SlackEstimator(1.0, 48, costs, cfg, overhead_s=0.004)
        assert loaded(stream) == pytest.approx(plain(stream) - to_go * 0.004)


def test_the_planner_weighs_slack_with_the_step_overhead_it_measured():
    """A waiting request whose first chunk fits its deadline on decode costs alone, but not once each step also
    takes the 8 ms the steps measurably took beyond them, is admitted instead of deferred behind a running stream."""
    from tests.scheduler.steps import lanes, stream, waiting
    from vllm_voxserve.scheduler.planner import Planner

    cfg = SchedulerPolicyConfig(first_chunk_frames=5, max_decode_batch=2)
    running = [stream("r", arrival=-0.178, frames=4)]  # 1 frame to its first chunk; a 12 ms prefill does not fit
    queue = [waiting("w", arrival=-0.101, tokens=800)]

    plain = Planner(cfg).plan_step(0.0, running, queue, lanes())
    assert plain.prefill_deferred and plain.admit == []
    measured = Planner(cfg)
    for _ in range(200):  # steps that each took 8 ms beyond the decode cost of their 2 rows
        measured.overload.capacity.observe_step(measured.costs.decode_step_s(2) + 0.008, 2)
    assert measured.overload.capacity.overhead_s == pytest.approx(0.008)
    plan = measured.plan_step(0.0, running, queue, lanes())
    assert plan.admit == ["w"] and not plan.prefill_deferred


def test_a_first_chunks_measured_way_to_audio_replaces_its_urgent_decode_and_later_chunks_keep_theirs():
    from tests.scheduler.steps import waiting
    from vllm_voxserve.scheduler.slack import waiting_slack

    cfg, costs = SchedulerPolicyConfig(first_chunk_frames=5), CostModel()
    extra = 0.03 - costs.urgent_codec_s(1)
    request = waiting("w", arrival=1.0, tokens=40)
    assert waiting_slack(request, 1.03, 64, costs, cfg, first_audio_s=0.03) == pytest.approx(
        waiting_slack(request, 1.03, 64, costs, cfg) - extra)
    first_chunk = StreamState("r", 0.9, frames_generated=3)
    later_chunk = StreamState("s", 0.5, frames_generated=12, first_audio_time=0.7)
    plain, measured = SlackEstimator(1.0, 48, costs, cfg), SlackEstimator(1.0, 48, costs, cfg, first_audio_s=0.03)
    assert measured(first_chunk) == pytest.approx(plain(first_chunk) - extra)
    assert measured(later_chunk) == plain(later_chunk)
