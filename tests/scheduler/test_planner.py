import pytest

from tests.scheduler.steps import ids, lanes, stream, waiting
from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.scheduler.planner import Planner
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.contract import CostSample, RequestProgress, StepReport


def later(rid, first_audio, chunk=1):
    """A request playing since `first_audio` whose chunk `chunk` is ready."""
    return stream(rid, frames=10 * (chunk + 1), delivered=chunk, first_audio=first_audio)


def test_first_chunk_goes_to_the_urgent_lane_while_the_background_lane_is_busy():
    planner = Planner()
    streams = [stream("new", arrival=1.0, frames=10)] + [later(f"b{i}", first_audio=0.5) for i in range(12)]
    plan = planner.plan_step(1.05, streams, [], lanes(background_busy=True))
    assert ids(plan.urgent) == [("new", 0)]
    assert plan.background == []


def test_first_chunk_never_joins_a_background_batch():
    planner = Planner()
    streams = [stream("new", arrival=1.0, frames=10)] + [later(f"b{i}", first_audio=0.5) for i in range(12)]
    plan = planner.plan_step(1.05, streams, [], lanes(urgent_busy=True))
    assert plan.urgent == []  # the urgent lane is busy: the first chunk waits for it ...
    assert ("new", 0) not in ids(plan.background) and len(plan.background) == 12  # ... not behind background work


def test_a_burst_of_first_chunks_takes_one_urgent_batch_with_the_served_defaults():
    # the urgent lane takes one batch per engine step: a burst split into batches waits a step for each further one
    planner = Planner(VoxServeConfig().scheduler_policy())
    streams = [stream(f"new{i}", arrival=1.0, frames=5) for i in range(32)]
    plan = planner.plan_step(1.05, streams, [], lanes(background_busy=True))
    assert len(plan.urgent) == 32


# Step table on a simulated clock: three requests whose chunk 1 is ready early; fewer than B = 8, so the background
# lane waits; each chunk turns urgent when its deadline (first_audio + 0.8 s) is less than δu = 100 ms away.
# The background lane is kept busy, so only urgency can move them.
STEPS = [
    {"now": 0.40, "urgent": [], "wake_at": pytest.approx(0.9 - 0.1)},
    {"now": 0.79, "urgent": [], "wake_at": pytest.approx(0.8)},
    {"now": 0.81, "urgent": [("a", 1)], "wake_at": pytest.approx(0.85)},
    {"now": 0.90, "urgent": [("b", 1), ("c", 1)], "wake_at": None},
]


def test_waiting_background_chunks_move_to_the_urgent_lane_within_delta_u():
    planner = Planner()
    streams = {"a": later("a", 0.1), "b": later("b", 0.15), "c": later("c", 0.16)}
    for step in STEPS:
        plan = planner.plan_step(step["now"], list(streams.values()), [], lanes(background_busy=True), lm_free=False)
        assert ids(plan.urgent) == step["urgent"], step
        assert plan.wake_at == step["wake_at"], step
        for chunk in plan.urgent:  # launched: in flight, then delivered
            streams[chunk.request_id].chunk_in_flight = True


def test_chunks_of_one_request_are_dispatched_in_order():
    planner = Planner()
    s = stream("a", frames=40, done=True, delivered=1, in_flight=True, first_audio=0.1)  # 1 in flight, 2, 3 ready
    plan = planner.plan_step(0.5, [s], [], lanes(), lm_free=False)
    assert plan.urgent == [] and plan.background == []
    s.chunk_in_flight, s.chunks_delivered = False, 2
    plan = planner.plan_step(0.5, [s], [], lanes(), lm_free=False)
    assert ids(plan.urgent + plan.background) == [("a", 2)]


def test_lm_plan_admits_decodes_and_sheds():
    planner = Planner(SchedulerPolicyConfig(overload_mode="reject"))
    running = [later("r", first_audio=0.1)]
    queue = [waiting("late", arrival=0.0), waiting("fresh", arrival=0.5)]
    plan = planner.plan_step(0.5, running, queue, lanes())
    assert [r.request_id for r in plan.reject] == ["late"]  # 500 ms old: cannot start audio within 200 ms
    assert plan.admit == ["fresh"] and plan.decode == ["r"]
    assert planner.plan_step(0.5, running, queue, lanes(), lm_free=False).admit == []


def test_on_arrival_rejects_only_in_reject_mode():
    streams = [stream(f"r{i}", frames=10, delivered=1, first_audio=0.15, expected=100) for i in range(500)]
    for mode, rejected in (("reject", True), ("off", False)):
        planner = Planner(SchedulerPolicyConfig(overload_mode=mode))
        assert (planner.on_arrival(0.2, waiting("new", arrival=0.2), streams, []) is not None) == rejected


def test_reports_update_streams_and_costs():
    s = stream("a")
    s.apply(RequestProgress("a", frames_generated=10, generation_done=False, chunks_delivered=1,
                            audio_delivered_s=0.8, first_audio_time=0.12))
    assert (s.frames_generated, s.chunks_delivered, s.first_audio_time, s.next_chunk) == (10, 1, 0.12, 1)
    with pytest.raises(ValueError):
        s.apply(RequestProgress("b", 0, False, 0, 0.0))
    planner = Planner()
    before = planner.costs.urgent_codec_s(1)
    planner.observe(StepReport(0.0, costs=[CostSample("urgent_codec", 1, 10 * before)]))
    assert planner.costs.urgent_codec_s(1) > before


def test_a_deferred_prefill_goes_in_once_its_request_has_no_more_slack_than_the_running_ones():
    """A playing request keeps about 4 ms of slack (it makes a frame per step, as the cost model predicts), short of
    the 4.4 ms prefill of a new arrival, whose own first chunk has 45 ms to spare (T = 95 ms here). The planner
    defers the arrival until its slack has run down to the playing request's (after about 43 ms; the paper's rule,
    weighing the running request alone, would hold it until that request's chunk is done or the deferral limit of
    100 ms forces it in)."""
    cfg = SchedulerPolicyConfig(first_chunk_frames=5, ttfa_target_s=0.095, overload_mode="off")
    planner = Planner(cfg)
    step_s = planner.costs.decode_step_s(1)
    # chunk 2 (frames 15-25) due at first_audio + 1.2 s; 10 frames to go at 1.1 s, 4 ms of slack
    playing = stream("p", frames=15, delivered=2, first_audio=1.1 - 1.2 + 10 * step_s
                     + planner.costs.background_codec_s(1) + 0.004)
    queue, now = [waiting("w", arrival=1.1)], 1.1
    while not planner.plan_step(now, [playing], queue, lanes()).admit:
        playing.frames_generated += 1
        now += step_s
    assert 0.04 < now - 1.1 < 0.05, now - 1.1
    # an arrival already past saving does not steer the rule (T = 40 ms: no slack from the start): held as before
    late = Planner(cfg.replace(ttfa_target_s=0.04))
    playing.frames_generated = 15
    assert late.plan_step(1.1, [playing], [waiting("w", arrival=1.1)], lanes()).prefill_deferred
