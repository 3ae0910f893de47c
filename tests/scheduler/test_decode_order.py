from tests.scheduler.steps import stream
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.decode_order import decode_order
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.slack import slacks
from vllm_voxserve.scheduler.timeline import ChunkSchedule

COSTS = CostModel()
DEADLINE_AWARE = SchedulerPolicyConfig(max_decode_batch=2)
PREFILL_FIRST = DEADLINE_AWARE.replace(admission_mode="prefill_first")


def order(streams, now, cfg):
    return decode_order(streams, slacks(streams, now, COSTS, cfg), cfg)


def scene():
    # at t = 1.0: two old requests with audio buffered, one new request waiting for its first chunk
    return [
        stream("old1", arrival=0.0, frames=25, delivered=2, first_audio=0.15),  # chunk 2 due at 1.75
        stream("old2", arrival=0.1, frames=15, delivered=1, first_audio=0.25),  # chunk 1 due at 1.05
        stream("new", arrival=0.95, frames=1),  # chunk 0 due at 1.15
        stream("done", arrival=0.0, frames=40, done=True, delivered=3, first_audio=0.1),
    ]


def test_all_fit_in_one_batch():
    assert order(scene()[:2], 1.0, DEADLINE_AWARE) == ["old1", "old2"]


def test_deadline_aware_takes_least_slack_first():
    assert order(scene(), 1.0, DEADLINE_AWARE) == ["old2", "new"]


def test_prefill_first_takes_arrival_order():
    assert order(scene(), 1.0, PREFILL_FIRST) == ["old1", "old2"]  # the new one waits for its first chunk


def test_no_request_starves_and_chunks_stay_on_time():
    """Six requests share a decode batch of four on a simulated clock (10 ms steps, codec instant).
    Least-slack order must keep every request progressing and every chunk before its deadline."""
    cfg = SchedulerPolicyConfig(max_decode_batch=4)
    schedule = ChunkSchedule()
    streams = [stream(f"r{i}", arrival=0.02 * i, expected=60) for i in range(6)]
    last_progress = {s.request_id: 0.0 for s in streams}
    late = []
    now = 0.0
    while any(not s.generation_done for s in streams) and now < 10:
        active = [s for s in streams if s.arrival_time <= now]
        for rid in order(active, now, cfg):
            s = next(x for x in streams if x.request_id == rid)
            s.frames_generated += 1
            s.generation_done = s.frames_generated >= 60
            last_progress[rid] = now
        now += 0.01
        for s in active:  # deliver complete chunks at once, in order
            while schedule.is_ready(s.chunks_delivered, s.frames_generated, s.generation_done):
                if now > s.deadline(s.chunks_delivered, cfg):
                    late.append((s.request_id, s.chunks_delivered))
                s.first_audio_time = s.first_audio_time or now
                s.chunks_delivered += 1
        for s in active:
            if not s.generation_done:
                assert now - last_progress[s.request_id] < 0.5, f"{s.request_id} starved"
    assert all(s.generation_done for s in streams)
    assert late == []
