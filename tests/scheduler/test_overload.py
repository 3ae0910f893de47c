import pytest

from tests.scheduler.steps import stream, waiting
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler import overload
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
    assert not rejection.by_limit  # refused for the frames the load needs, not for a count the API server can hold
    assert guard(OFF).check_arrival(0.2, waiting("new", arrival=0.2), streams, []) is None


def test_first_audio_too_late_is_rejected():
    g = guard()
    queue = [waiting(f"w{i}", arrival=1.0) for i in range(SHED.max_prefills_per_step * 10)]
    rejection = g.check_arrival(1.0, waiting("new", arrival=1.0), [], queue)
    assert rejection is not None and "first audio" in rejection.reason
    assert g.check_arrival(1.0, waiting("new", arrival=1.0), [], queue[:1]) is None


@pytest.mark.parametrize("waited_s", [0.0, 0.05, 0.12, 0.19])
def test_the_arrival_check_counts_the_time_a_request_took_to_reach_the_engine(waited_s):
    # what the API server spent on it is gone from T, as the shedding of waiting requests counts it: a request
    # accepted at arrival and shed at the next step has its refusal answered a step or more later
    streams = [stream(f"r{i}", arrival=0.1 * i, frames=30, delivered=2, first_audio=0.1 * i + 0.15) for i in range(8)]
    request, now = waiting("new", arrival=1.0), 1.0 + waited_s
    predicted = guard().first_audio_s(request, running=8, queued_ahead=0)  # ≈ 100 ms from the engine's now
    refused = guard().check_arrival(now, request, streams, []) is not None
    assert refused == (waited_s + predicted > SHED.ttfa_target_s)
    assert refused == (waited_s > 0.1)  # the cases straddle it: ≈ 100 ms of T left once it reaches the engine
    assert refused == bool(guard().shed_waiting(now, [request], running=8))


@pytest.mark.parametrize("waited_s, doomed", [(0.0, False), (0.05, False), (0.12, True)])
def test_waiting_requests_that_cannot_meet_ttfa_are_shed(waited_s, doomed):
    # a first chunk takes ≈ 10 steps of ≈ 9 ms plus prefill and codec: ≈ 100 ms
    rejections = guard().shed_waiting(1.0 + waited_s, [waiting("w", arrival=1.0)], running=8)
    assert bool(rejections) == doomed
    assert guard(OFF).shed_waiting(1.0 + waited_s, [waiting("w", arrival=1.0)], running=8) == []


def test_measured_step_interval_lowers_the_capacity_estimate():
    g = guard()
    before = g.capacity.backbone_frames_per_s()
    rows = 64
    g.capacity.observe_step(g.costs.decode_step_s(rows) + 0.01, rows)  # 10 ms beyond the decode cost, once
    assert g.capacity.overhead_s == pytest.approx(0.1 * 0.01)  # smoothed
    assert g.capacity.backbone_frames_per_s() < before
    for _ in range(200):
        g.capacity.observe_step(g.costs.decode_step_s(rows) + 0.01, rows)
    full = SHED.max_decode_batch
    assert g.capacity.backbone_frames_per_s() == pytest.approx(full / (g.costs.decode_step_s(full) + 0.01), rel=1e-3)


def test_the_step_at_a_full_batch_is_predicted_from_its_cost_not_the_current_interval():
    # light load: short steps at a small batch; the full batch's step is still the cost line's at full batch
    g = guard()
    for _ in range(50):
        g.capacity.observe_step(g.costs.decode_step_s(8), 8)
    assert g.capacity.step_s(SHED.max_decode_batch) == pytest.approx(g.costs.decode_step_s(SHED.max_decode_batch))


def _codec_bound(cfg=SHED):
    """A cost model whose background lane makes far fewer frames/s than the backbone."""
    from vllm_voxserve.scheduler.costs import CostSeed, LinearCost, paper_h100_seed

    seed = paper_h100_seed()
    slow = CostSeed(seed.decode, seed.prefill, seed.urgent_codec, LinearCost(0.0, 0.02))  # 20 ms a chunk: 500 fr/s
    return OverloadGuard(cfg, CostModel(slow))


def test_codec_lane_bounds_admission_when_it_is_the_slower_lane():
    # 60 streams a second into playback, first chunk out, their next chunks generated but not decoded
    streams = [stream(f"r{i}", arrival=0.0, frames=30, delivered=1, first_audio=0.15, expected=100) for i in range(60)]
    fast, slow = guard(), _codec_bound()
    assert fast.check_arrival(0.3, waiting("new", arrival=0.3), streams, []) is None
    rejection = slow.check_arrival(0.3, waiting("new", arrival=0.3), streams, [])
    assert rejection is not None and "codec" in rejection.reason
    assert slow.decisions[overload.REFUSED_CODEC] == 1 and fast.decisions[overload.ACCEPTED] == 1
    estimate = slow.capacity.estimate()
    assert estimate.bound_by == "codec" and estimate.frames_per_s == estimate.codec_frames_per_s


def test_codec_demand_leaves_out_first_chunks_and_decoded_frames():
    s = ChunkSchedule(first_chunk_frames=5, chunk_frames=10)
    cfg = SHED.replace(first_chunk_frames=5)
    g = OverloadGuard(cfg, CostModel())
    # playing since 1.0, 35 frames generated, chunks 0-1 decoded (frames 0..14): by 1.0 + h the player needs
    # min(frames played in h rounded up to a chunk, 35 generated ... 100)
    st = stream("a", arrival=0.9, frames=35, delivered=2, first_audio=1.0, expected=100)
    demand = g.frame_demand(1.0, [st], [])
    for i, h in enumerate(cfg.demand_horizons_s):
        due_codec = overload.frames_due_by(1.0 + h, 100, 0.9, 1.0, s, cfg.ttfa_target_s)
        assert demand.codec[i] == max(due_codec - s.start_frame(2), 0)
        due_lm = overload.frames_due_by(1.0 + h + cfg.urgent_margin_s, 100, 0.9, 1.0, s, cfg.ttfa_target_s)
        assert demand.backbone[i] == max(due_lm - 35, 0)
    # a new request: its first chunk is the urgent lane's, so the codec lane owes it nothing within T
    fresh = g.frame_demand(1.0, [], [waiting("w", arrival=1.0)])
    assert fresh.codec[0] == 0 and fresh.backbone[0] > 0


def test_accepted_requests_count_until_the_demand_is_refreshed():
    cfg = SHED.replace(demand_refresh_s=10.0)
    g = OverloadGuard(cfg, CostModel())
    streams = [stream(f"r{i}", arrival=0.0, frames=10, delivered=1, first_audio=0.15, expected=100) for i in range(100)]
    queued = []  # an accepted request joins the queue, as the planner's caller does
    while g.check_arrival(0.2, waiting(f"n{len(queued)}", arrival=0.2), streams, queued) is None:
        queued.append(waiting(f"n{len(queued)}", arrival=0.2))
        assert len(queued) < 10_000
    accepted = len(queued)
    assert accepted > 0
    # recomputing each time, with the accepted requests queued: the same limit
    fresh = OverloadGuard(SHED.replace(demand_refresh_s=0.0), CostModel())
    queued = [waiting(f"n{i}", arrival=0.2) for i in range(accepted)]
    assert fresh.check_arrival(0.2, waiting("x", arrival=0.2), streams, queued) is not None
    assert fresh.check_arrival(0.2, waiting("x", arrival=0.2), streams, queued[:-1]) is None


def test_decisions_are_counted_and_taken():
    g = guard()
    g.check_arrival(1.0, waiting("a", arrival=1.0), [], [])
    queue = [waiting(f"w{i}", arrival=1.0) for i in range(SHED.max_prefills_per_step * 10)]
    g.check_arrival(1.0, waiting("late", arrival=1.0), [], queue)
    taken = g.take_decisions()
    assert taken == {overload.ACCEPTED: 1, overload.REFUSED_FIRST_AUDIO: 1}
    assert not g.take_decisions()


def test_a_first_chunks_measured_way_to_audio_replaces_the_urgent_decode_in_first_audio_predictions():
    from vllm_voxserve.contract import StepReport
    from vllm_voxserve.scheduler.planner import Planner

    planner = Planner(SHED)
    capacity, request = planner.overload.capacity, waiting("w", arrival=0.0)
    assert capacity.first_audio_handover_s() == planner.costs.urgent_codec_s(1)  # nothing measured yet
    before = planner.overload.first_audio_s(request, running=10, queued_ahead=0)
    # 1..41 ms (the estimate is recomputed at the first and then every 8th: the 41st is one)
    planner.observe(StepReport(0.0, first_audio_handovers=[0.001 * (i + 1) for i in range(41)]))
    planner.observe(StepReport(0.0, first_audio_handovers=[-1.0]))  # not a hand-over: ignored
    assert capacity.first_audio_handover_s() == pytest.approx(0.037)  # the 90th percentile of the 41
    after = planner.overload.first_audio_s(request, running=10, queued_ahead=0)
    assert after - before == pytest.approx(0.037 - planner.costs.urgent_codec_s(1))
    for _ in range(56):  # the latest 64 count: 8 slow ones are still among them, the 90th percentile is one
        capacity.observe_first_audio(0.005)
    assert capacity.first_audio_handover_s() == pytest.approx(0.034)
    for _ in range(8):  # now all 64 are fast: the slow ones aged out
        capacity.observe_first_audio(0.005)
    assert capacity.first_audio_handover_s() == pytest.approx(0.005)


def test_a_request_whose_first_audio_the_measured_hand_over_makes_late_is_refused():
    from vllm_voxserve.contract import StepReport
    from vllm_voxserve.scheduler.planner import Planner

    running = [stream(f"r{i}", arrival=0.0, frames=30, delivered=2, first_audio=0.15) for i in range(100)]
    request = waiting("new", arrival=1.0)
    planner = Planner(SHED)
    predicted = planner.overload.first_audio_s(request, running=100, queued_ahead=0)
    assert predicted < SHED.ttfa_target_s  # on costs alone it makes it
    assert planner.on_arrival(1.0, request, running, []) is None
    late = SHED.ttfa_target_s - predicted + planner.costs.urgent_codec_s(1) + 0.01  # 10 ms past T once measured
    planner = Planner(SHED)
    planner.observe(StepReport(0.0, first_audio_handovers=[late] * 20))
    rejection = planner.on_arrival(1.0, request, running, [])
    assert rejection is not None and "first audio predicted" in rejection.reason


GROWTH = SHED.replace(first_audio_step_growth=True)


def _steps_with_host_time_a_row(capacity, costs, rows_seq, base_s=0.001, per_row_s=35e-6):
    for rows in rows_seq:
        capacity.observe_step(costs.decode_step_s(rows) + base_s + per_row_s * rows, rows)


def test_the_host_time_a_row_adds_is_fitted_only_with_first_audio_step_growth():
    rows_seq = [40 + (i * 7) % 88 for i in range(3000)]  # 40..127 rows, spread as a load's steps are
    flat, grown = guard(), guard(GROWTH)
    for g in (flat, grown):
        _steps_with_host_time_a_row(g.capacity, g.costs, rows_seq)
    assert flat.capacity.overhead_per_row_s == 0.0 and flat.capacity.rows_mean is None
    assert grown.capacity.overhead_per_row_s == pytest.approx(35e-6, rel=0.15)
    # at the rows just seen both predict the step alike; at more rows only the fitted host time a row grows it
    seen = round(grown.capacity.rows_mean)
    assert grown.capacity.first_audio_step_s(seen) == pytest.approx(flat.capacity.first_audio_step_s(seen), abs=3e-4)
    actual = grown.costs.decode_step_s(128) + 0.001 + 35e-6 * 128
    assert grown.capacity.first_audio_step_s(128) == pytest.approx(actual, rel=0.05)
    assert flat.capacity.first_audio_step_s(128) < actual - 0.001  # the flat overhead misses over a millisecond
    assert flat.capacity.first_audio_step_s(128) == flat.capacity.step_s(128)


def test_rows_all_alike_fit_no_host_time_a_row():
    g = guard(GROWTH)
    _steps_with_host_time_a_row(g.capacity, g.costs, [64] * 500)
    assert g.capacity.overhead_per_row_s == 0.0  # no spread of rows: the slope is unknown, not zero by fit
    assert g.capacity.first_audio_step_s(100) == pytest.approx(g.costs.decode_step_s(100) + g.capacity.overhead_s)


def test_a_growing_load_predicts_a_later_first_audio_than_a_steady_one_of_the_same_size():
    rows_seq = [40 + (i * 7) % 88 for i in range(3000)]
    steady, growing = guard(GROWTH), guard(GROWTH)
    for g in (steady, growing):
        _steps_with_host_time_a_row(g.capacity, g.costs, rows_seq)
    request = waiting("new", arrival=1.0)
    for k in range(26):  # 100 requests in progress at each arrival, against 50 growing to 100 over 250 ms
        t = 0.75 + 0.01 * k
        steady._note_load(t, 100)
        growing._note_load(t, 50 + 2 * k)
    assert steady.rows_growth_per_s == 0.0
    assert growing.rows_growth_per_s == pytest.approx(200.0)
    at_steady = steady.first_audio_s(request, running=100, queued_ahead=0)
    at_growth = growing.first_audio_s(request, running=100, queued_ahead=0)
    assert at_growth > at_steady + 0.002
    flat = guard()  # without the option the growth is not looked at
    flat._note_load(0.75, 50)
    flat._note_load(1.0, 100)
    assert flat.first_audio_s(request, running=100, queued_ahead=0) == pytest.approx(
        SHED.first_chunk_frames * flat.step_s(101) + flat.costs.prefill_s(request.prompt_tokens)
        + flat.capacity.first_audio_handover_s())


def test_arrivals_note_the_load_only_with_first_audio_step_growth():
    streams = [stream(f"r{i}", arrival=0.0, frames=30, delivered=2, first_audio=0.15) for i in range(8)]
    flat, grown = guard(SHED.replace(feedback_limit=False)), guard(GROWTH.replace(feedback_limit=False))
    for g in (flat, grown):
        assert g.check_arrival(1.0, waiting("a", arrival=1.0), streams, []) is None
    assert not flat._loads and list(grown._loads) == [(1.0, 8)]
