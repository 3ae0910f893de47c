import pytest

from tests.scheduler.steps import ids, stream
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.urgency import ready_chunks, split_by_urgency, urgent_batch

CFG = SchedulerPolicyConfig()


def test_ready_chunk_is_the_next_one_only_when_complete_and_nothing_in_flight():
    streams = [
        stream("a", frames=9),  # chunk 0 incomplete
        stream("b", frames=10),  # chunk 0 ready
        stream("c", frames=30, delivered=1, in_flight=True, first_audio=0.1),  # chunk 1 in the codec: wait
        stream("d", frames=30, delivered=2, first_audio=0.1),  # chunk 2 ready
        stream("e", frames=23, done=True, delivered=2, first_audio=0.1),  # last, partial chunk 2 (3 frames)
    ]
    ready = ready_chunks(streams, CFG)
    assert ids(ready) == [("b", 0), ("d", 2), ("e", 2)]
    assert ready[2].frames == 3
    assert ready[1].deadline == pytest.approx(0.1 + 1.6)


# Step table: one request with first audio at t=0.1, chunk 2 ready (deadline 1.7); δu = 100 ms.
URGENCY_STEPS = [
    {"now": 0.50, "urgent": False},
    {"now": 1.59, "urgent": False},  # 110 ms left
    {"now": 1.61, "urgent": True},  # 90 ms left: within δu
    {"now": 1.80, "urgent": True},  # already late
]


@pytest.mark.parametrize("step", URGENCY_STEPS, ids=lambda s: f"t={s['now']}")
def test_chunk_turns_urgent_within_delta_u(step):
    ready = ready_chunks([stream("d", frames=30, delivered=2, first_audio=0.1)], CFG)
    urgent, background = split_by_urgency(ready, step["now"], CFG.urgent_margin_s)
    assert (len(urgent), len(background)) == ((1, 0) if step["urgent"] else (0, 1))


def test_first_chunk_is_always_urgent():
    ready = ready_chunks([stream("n", arrival=5.0, frames=10)], CFG)
    urgent, background = split_by_urgency(ready, now=5.0, urgent_margin_s=CFG.urgent_margin_s)
    assert ids(urgent) == [("n", 0)] and background == []


def test_urgent_batch_in_deadline_order_capped():
    streams = [stream(f"r{i}", arrival=1.0 - 0.01 * i, frames=10) for i in range(10)]
    batch = urgent_batch(ready_chunks(streams, CFG), max_batch=8)
    assert len(batch) == 8
    assert [c.request_id for c in batch] == [f"r{i}" for i in range(9, 1, -1)]  # earliest deadline first


def test_ready_chunks_agree_with_the_chunk_schedule_and_deadlines_on_random_streams():
    """`ready_chunks` inlines the schedule's arithmetic for speed: the same answers as `ChunkSchedule` and
    `chunk_deadline` give, over random states and two chunk layouts."""
    import random

    from vllm_voxserve.scheduler.streams import StreamState, schedule_of
    from vllm_voxserve.scheduler.timeline import chunk_deadline

    rng = random.Random(0)
    for cfg in (CFG, SchedulerPolicyConfig(first_chunk_frames=5, chunk_frames=10, ttfa_target_s=0.15)):
        schedule = schedule_of(cfg)
        streams = []
        for i in range(400):
            delivered = rng.randint(0, 6)
            made = max(0, schedule.start_frame(delivered) + rng.randint(-3, 14))
            streams.append(StreamState(f"r{i}", rng.uniform(0, 5), frames_generated=made,
                                       generation_done=rng.random() < 0.3, chunks_delivered=delivered,
                                       chunk_in_flight=rng.random() < 0.2,
                                       first_audio_time=None if delivered == 0 or rng.random() < 0.2 else 6.0))
        expected = []
        for s in streams:
            k = s.next_chunk
            if s.chunk_in_flight or not schedule.is_ready(k, s.frames_generated, s.generation_done):
                continue
            frames = min(schedule.end_frame(k), s.frames_generated) - schedule.start_frame(k)
            deadline = chunk_deadline(schedule, k, s.arrival_time, cfg.ttfa_target_s, s.first_audio_time)
            expected.append((s.request_id, k, deadline, frames))
        got = [tuple(c) for c in ready_chunks(streams, cfg)]
        assert len(got) > 50 and [g[:2] + g[3:] for g in got] == [e[:2] + e[3:] for e in expected]
        assert [g[2] for g in got] == pytest.approx([e[2] for e in expected])
