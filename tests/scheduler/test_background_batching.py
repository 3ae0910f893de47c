import pytest

from tests.scheduler.steps import ids, stream
from vllm_voxserve.scheduler.background_batching import background_batch
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.urgency import ready_chunks

CFG = SchedulerPolicyConfig(background_max_batch=32)  # B = 8, largest batch 32, δu = 100 ms, early-launch slack 100 ms
COSTS = CostModel()


def later_chunks(count, first_audio=0.0, stagger=0.01):
    """`count` requests, each with chunk 1 ready; request i started playing at first_audio + i * stagger."""
    streams = [stream(f"r{i:02d}", frames=20, delivered=1, first_audio=first_audio + i * stagger) for i in range(count)]
    return ready_chunks(streams, CFG)


# Step table. Chunk 1 of request 0 is due at 0.8 s; the lane waits for B chunks unless a deadline approaches
# (slack after the batch < δu + early slack) or the LM has nothing left to generate.
STEPS = [
    {"now": 0.10, "ready": 3, "lm_has_work": True, "launch": 0},
    {"now": 0.10, "ready": 7, "lm_has_work": True, "launch": 0},
    {"now": 0.10, "ready": 8, "lm_has_work": True, "launch": 8},  # B reached
    {"now": 0.10, "ready": 40, "lm_has_work": True, "launch": 32},  # capped at the largest executable
    {"now": 0.10, "ready": 3, "lm_has_work": False, "launch": 3},  # nothing more will come
    {"now": 0.55, "ready": 3, "lm_has_work": True, "launch": 0},  # 250 ms left: still worth waiting
    {"now": 0.62, "ready": 3, "lm_has_work": True, "launch": 3},  # 180 ms left, minus the batch: launch early
]


@pytest.mark.parametrize("step", STEPS, ids=lambda s: f"t={s['now']}-n={s['ready']}-lm={s['lm_has_work']}")
def test_background_launch_rule(step):
    batch = background_batch(later_chunks(step["ready"]), step["now"], step["lm_has_work"], COSTS, CFG)
    assert len(batch) == step["launch"]


def test_batch_is_in_deadline_order():
    ready = later_chunks(40)[::-1]
    batch = background_batch(ready, 0.1, True, COSTS, CFG)
    assert ids(batch) == [(f"r{i:02d}", 1) for i in range(32)]
    assert all(a.deadline <= b.deadline for a, b in zip(batch, batch[1:]))
