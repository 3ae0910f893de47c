import pytest

from tests.scheduler.steps import stream, waiting
from vllm_voxserve.scheduler.admission import PrefillAdmission
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.slack import min_slack, slacks

DEADLINE_AWARE = SchedulerPolicyConfig(admission_mode="deadline_aware")
PREFILL_FIRST = SchedulerPolicyConfig(admission_mode="prefill_first")
COSTS = CostModel()
PREFILL_S = COSTS.prefill_s(40)  # ≈ 4.4 ms for one 40-token prompt

# Step table on a simulated clock (10 ms steps). "slack": smallest slack of the running requests.
# "admit": how many waiting requests are admitted; "forced": admitted because the deferral limit was reached.
DEADLINE_AWARE_STEPS = [
    {"now": 0.00, "slack": 0.050, "admit": 8, "forced": False},  # plenty of slack: pack up to 8 prompts
    {"now": 0.01, "slack": PREFILL_S + 0.0002, "admit": 1, "forced": False},  # exactly one prefill fits
    {"now": 0.02, "slack": 0.003, "admit": 0, "forced": False},  # deferral starts (streak from 0.02)
    {"now": 0.06, "slack": 0.002, "admit": 0, "forced": False},
    {"now": 0.11, "slack": 0.001, "admit": 0, "forced": False},  # 90 ms in a row; the next step comes at 100 ms
    {"now": 0.12, "slack": 0.001, "admit": 8, "forced": True},  # 100 ms, and the next step would pass it: a pack
    {"now": 0.13, "slack": 0.001, "admit": 0, "forced": False},  # a new streak
    {"now": 0.14, "slack": float("inf"), "admit": 8, "forced": False},  # nothing running: admit
]


def test_deadline_aware_admission_step_table():
    policy = PrefillAdmission(DEADLINE_AWARE, COSTS)
    queue = [waiting(f"w{i}", arrival=0.0) for i in range(40)]
    for step in DEADLINE_AWARE_STEPS:
        decision = policy.decide(step["now"], queue, step["slack"], next_step_s=0.01)
        expected = step["admit"]
        assert (len(decision.admit), decision.forced) == (expected, step["forced"]), step
        assert decision.deferred == (step["admit"] == 0)
        assert [w.request_id for w in decision.admit] == [w.request_id for w in queue[:expected]]
        queue = queue[expected:]


def test_prefill_first_admits_at_once_whatever_the_slack():
    policy = PrefillAdmission(PREFILL_FIRST, COSTS)
    queue = [waiting(f"w{i}") for i in range(3)]
    for now in (0.0, 0.01, 0.02):
        decision = policy.decide(now, queue, smallest_slack_s=-1.0)
        assert [w.request_id for w in decision.admit] == ["w0", "w1", "w2"] and not decision.deferred


def test_prefill_packing_respects_token_budget():
    cfg = DEADLINE_AWARE.replace(max_prefill_tokens=100)
    decision = PrefillAdmission(cfg, COSTS).decide(0.0, [waiting(f"w{i}", tokens=40) for i in range(4)], 1.0)
    assert len(decision.admit) == 2


@pytest.mark.parametrize("slack", [0.0, 0.001, -0.5])
def test_no_prefill_is_deferred_more_than_100_ms_in_a_row(slack):
    """Running requests short on slack at every step: a prefill still goes in every 100 ms."""
    policy = PrefillAdmission(DEADLINE_AWARE, COSTS)
    queue = [waiting(f"w{i}") for i in range(200)]  # each forced admission takes a pack of 8
    step_s, first_deferred, spans = 0.007, None, []  # 7 ms steps: not a divisor of 100 ms
    for step in range(300):
        now = step * step_s
        decision = policy.decide(now, queue, slack, next_step_s=step_s)
        if decision.deferred and first_deferred is None:
            first_deferred = now
        if decision.admit:
            queue = queue[len(decision.admit) :]
            if first_deferred is not None:
                spans.append(now - first_deferred)
            first_deferred = None
    assert len(spans) >= 15
    assert max(spans) <= DEADLINE_AWARE.max_prefill_deferral_s + 1e-9
    assert min(spans) >= DEADLINE_AWARE.max_prefill_deferral_s - step_s  # and it did defer about that long


def test_requests_already_late_do_not_hold_back_prefills():
    # r0 is far past its first-chunk deadline (negative slack); r1 has room.
    streams = [stream("r0", arrival=0.0, frames=2), stream("r1", arrival=0.5, frames=2)]
    values = slacks(streams, now=0.45, costs=COSTS, cfg=DEADLINE_AWARE).values()
    assert min(values) < 0
    assert min_slack(values) > 0.1  # the late one is left out (the paper's literal rule counts it)


def test_a_waiting_request_with_no_more_slack_than_the_running_ones_is_not_deferred():
    """Earliest deadline first across both queues: the prefill does not fit the running requests' 3 ms, so it waits
    while the oldest waiting request has more slack than they do, and goes in (with the pack behind it) once it has
    no more (the paper's rule weighs the running requests alone)."""
    policy = PrefillAdmission(DEADLINE_AWARE, COSTS)
    queue = [waiting(f"w{i}") for i in range(3)]
    assert policy.decide(0.0, queue, 0.003, 0.01, waiting_slack_s=0.020).deferred
    decision = policy.decide(0.01, queue, 0.003, 0.01, waiting_slack_s=0.003)
    assert [w.request_id for w in decision.admit] == ["w0", "w1", "w2"]
    assert not decision.deferred and not decision.forced and policy.deferral_deadline() is None
