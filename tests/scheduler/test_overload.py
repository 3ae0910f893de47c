import pytest

from tests.scheduler.steps import stream, waiting
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.overload import OverloadGuard, frames_needed_by
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.timeline import ChunkSchedule

# the scenarios below are sized for a decode batch of 128 frames a step
SHED = SchedulerPolicyConfig(overload_mode="reject", max_decode_batch=128)
OFF = SchedulerPolicyConfig(overload_mode="off", max_decode_batch=128)


def guard(cfg=SHED):
    return OverloadGuard(cfg, CostModel())


def test_frames_needed_follow_chunk_deadlines():
    s = ChunkSchedule()
    # first audio at 1.0: chunk 1 (frames 10..19) is due at 1.8, chunk 2 at 2.6
    need = [frames_needed_by(t, 12, 100, 0.9, 1.0, s, 0.2) for t in (1.79, 1.8, 2.6, 30.0)]
    assert need == [0, 8, 18, 88]  # nothing new due before 1.8; then chunk 1; then chunk 2; then all
    assert frames_needed_by(1.0, 0, 100, 0.9, None, s, 0.2) == 0  # first chunk not due before arrival + T
    assert frames_needed_by(1.1, 0, 100, 0.9, None, s, 0.2) == 10


def test_light_load_is_accepted():
    streams = [stream(f"r{i}", arrival=0.1 * i, frames=30, delivered=2, first_audio=0.1 * i + 0.15) for i in range(8)]
    assert guard().check_arrival(1.0, waiting("new", arrival=1.0), streams, []) is None


def test_demand_past_capacity_is_rejected_with_retry_after_and_reason():
    # 500 streams that just started playing: each needs 10 more frames within the next 1.1 s
    streams = [stream(f"r{i}", arrival=0.0, frames=10, delivered=1, first_audio=0.15, expected=100) for i in range(500)]
    rejection = guard().check_arrival(0.2, waiting("new", arrival=0.2), streams, [])
    assert rejection is not None and rejection.request_id == "new"
    assert rejection.retry_after_s >= SHED.min_retry_after_s
    assert "frames/s" in rejection.reason
    assert guard(OFF).check_arrival(0.2, waiting("new", arrival=0.2), streams, []) is None


def test_first_audio_too_late_is_rejected():
    g = guard()
    queue = [waiting(f"w{i}", arrival=1.0) for i in range(SHED.max_prefills_per_step * 10)]
    rejection = g.check_arrival(1.0, waiting("new", arrival=1.0), [], queue)
    assert rejection is not None and "first audio" in rejection.reason
    assert g.check_arrival(1.0, waiting("new", arrival=1.0), [], queue[:1]) is None


@pytest.mark.parametrize("waited_s, doomed", [(0.0, False), (0.05, False), (0.12, True)])
def test_waiting_requests_that_cannot_meet_ttfa_are_shed(waited_s, doomed):
    # a first chunk takes ≈ 10 steps of ≈ 9 ms plus prefill and codec: ≈ 100 ms
    rejections = guard().shed_waiting(1.0 + waited_s, [waiting("w", arrival=1.0)], running=8)
    assert bool(rejections) == doomed
    assert guard(OFF).shed_waiting(1.0 + waited_s, [waiting("w", arrival=1.0)], running=8) == []


def test_measured_step_interval_lowers_the_capacity_estimate():
    g = guard()
    before = g.capacity_frames_per_s()
    g.observe_step_interval(0.05)
    assert g.capacity_frames_per_s() < before
    assert g.capacity_frames_per_s() == pytest.approx(SHED.max_decode_batch / 0.05)
