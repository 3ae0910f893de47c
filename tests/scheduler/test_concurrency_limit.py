import math

import pytest

from tests.scheduler.steps import stream, waiting
from vllm_voxserve.scheduler.concurrency_limit import ConcurrencyLimit, LimitSettings, StreamEvidence
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.overload import REFUSED_LIMIT, OverloadGuard
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.timeline import ChunkSchedule

T = 0.2


def limit(floor=16, **settings):
    """A limit fed by the engine's streams."""
    return StreamEvidence(ConcurrencyLimit(LimitSettings(T, floor, **settings)), ChunkSchedule())


def started(n, arrival, ttfa, prefix="r", frames=20, delivered=1):
    """n streams that arrived at `arrival` and got their first audio `ttfa` later, playing on time."""
    return [stream(f"{prefix}{i}", arrival=arrival, frames=frames, delivered=delivered, first_audio=arrival + ttfa,
                   expected=100) for i in range(n)]


def test_no_limit_until_first_audio_comes_late():
    lim = limit()
    for t in (0.0, 0.3, 0.6, 0.9):  # on-time first audio (100 ms), windows close at 0.6
        lim.observe(t, started(40, 0.0, 0.1), in_progress=300)
    assert lim.limit.limit == math.inf and lim.limit.admits(10_000) and lim.limit.misses == 0


def test_late_first_audio_cuts_the_limit_to_a_share_of_the_requests_in_progress():
    lim = limit()
    lim.observe(0.0, [], in_progress=200)
    lim.observe(0.5, started(40, 0.1, 0.21), in_progress=200)  # every first audio 10 ms past T
    assert lim.limit.misses == 1 and lim.limit.limit == 0.9 * 200
    assert lim.limit.admits(179) and not lim.limit.admits(180)


def test_first_audio_near_t_or_a_rare_late_one_does_not_cut():
    lim = limit()
    lim.observe(0.0, [], in_progress=200)
    lim.observe(0.5, started(99, 0.1, 0.199) + started(1, 0.1, 0.3, prefix="late"), in_progress=200)
    assert lim.limit.misses == 0 and lim.limit.limit == math.inf


def test_one_or_two_late_in_a_window_of_a_poisson_burst_do_not_cut_three_do():
    # 80 req/s: 40 first audios a window; a server meeting 99 % has one late among them in a third of its windows
    lim = limit()
    lim.observe(0.0, [], in_progress=120)
    lim.observe(0.5, started(38, 0.1, 0.12) + started(2, 0.1, 0.25, prefix="late"), in_progress=120)
    assert lim.limit.misses == 0 and lim.limit.limit == math.inf
    lim.observe(1.0, started(37, 0.6, 0.12, prefix="b") + started(3, 0.6, 0.25, prefix="late_b"), in_progress=120)
    assert lim.limit.misses == 1 and lim.limit.limit == 0.9 * 120
    assert lim.limit.last_cut == "late: 3 of 40 first audios" and lim.limit.last_cut_cause == "late"


def test_one_dry_stream_among_few_does_not_cut_two_do():
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, in_progress=30)
    lim.observe(0.5, in_progress=30, playing=30, dry=1)
    assert lim.misses == 0
    lim.observe(0.7, in_progress=30, playing=30, dry=2)
    lim.observe(1.0, in_progress=30, playing=30, dry=0)
    assert lim.misses == 1 and lim.limit == 0.9 * 30
    assert lim.last_cut == "dry: 2 of 30 streams" and lim.last_cut_cause == "dry"


def test_misses_of_requests_admitted_before_a_cut_do_not_cut_again():
    lim = limit()
    lim.observe(0.0, [], in_progress=200)
    lim.observe(0.5, started(40, 0.1, 0.21), in_progress=200)
    assert lim.limit.limit == 180
    # the next window: late first audio only from requests that arrived before the cut at 0.5
    lim.observe(1.0, started(40, 0.1, 0.21) + started(40, 0.45, 0.5, prefix="old"), in_progress=170)
    assert lim.limit.misses == 1 and lim.limit.limit == 180
    # requests admitted after the cut that come late cut again, from the requests in progress then
    lim.observe(1.5, started(40, 1.1, 0.3, prefix="new"), in_progress=150)
    assert lim.limit.misses == 2 and lim.limit.limit == 0.9 * 150


def test_dry_playback_cuts_the_limit():
    lim = limit()
    lim.observe(0.0, [], in_progress=100)
    # first audio at 0.2 and only the 10-frame first chunk delivered: the next chunk was due at 1.0
    dry = [stream(f"d{i}", arrival=0.0, frames=20, delivered=1, first_audio=0.2, expected=100) for i in range(3)]
    lim.observe(1.1, started(97, 0.5, 0.1, frames=20, delivered=1) + dry, in_progress=100)
    assert lim.limit.misses == 1 and lim.limit.limit == 90


def test_a_chunk_a_few_ms_overdue_is_not_dry_yet():
    # the next chunk of each of 3 streams was due at 1.0; the engine learns of deliveries a step report late
    lim = limit()
    lim.observe(0.0, [], in_progress=100)
    overdue = [stream(f"d{i}", arrival=0.0, frames=20, delivered=1, first_audio=0.2, expected=100) for i in range(3)]
    on_time = started(97, 0.5, 0.1, frames=20, delivered=1)
    lim.observe(1.04, on_time + overdue, in_progress=100)  # 40 ms overdue: the window closes clean
    assert lim.limit.misses == 0
    lim.observe(1.06, on_time + overdue, in_progress=100)  # 60 ms overdue: dry
    lim.observe(1.6, [], in_progress=100)
    assert lim.limit.misses == 1


def test_finished_streams_are_not_dry():
    lim = limit()
    lim.observe(0.0, [], in_progress=10)
    done = [stream(f"f{i}", arrival=0.0, frames=5, done=True, delivered=1, first_audio=0.1) for i in range(5)]
    lim.observe(2.0, done, in_progress=10)
    assert lim.limit.misses == 0


def test_a_clean_window_raises_a_binding_limit_and_leaves_a_slack_one():
    lim = limit()
    lim.observe(0.0, [], in_progress=200)
    lim.observe(0.5, started(40, 0.1, 0.21), in_progress=200)
    assert lim.limit.limit == 180
    lim.observe(1.0, started(40, 0.6, 0.1, prefix="a"), in_progress=100)  # far below the limit: unchanged
    assert lim.limit.limit == 180
    lim.observe(1.2, started(40, 0.6, 0.1, prefix="a"), in_progress=179)  # bound during the window
    lim.observe(1.5, started(40, 0.6, 0.1, prefix="a"), in_progress=150)
    assert lim.limit.limit == 180 * 1.05


def test_clean_windows_in_a_row_regrow_a_burst_cut_within_seconds_and_a_cut_starts_small_again():
    """A burst cut the limit to 52; arrivals then spread out and 130 in progress stay on time: the raises double (5,
    10, 20 %, then 25 % at most) and the limit passes 130 in 6 windows of 0.5 s, where 5 % a window took 19."""
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, 58)
    for _ in range(20):
        lim.first_audio(0.1, 0.3)
    lim.observe(0.5, 58)
    assert lim.limit == 0.9 * 58
    raised, t = [], 0.5
    while lim.limit < 130:
        before = lim.limit
        for _ in range(20):
            lim.first_audio(t, 0.1)  # every first audio on time
        t += 0.5
        lim.observe(t, int(lim.limit))  # bound: as many in progress as the limit admits
        raised.append(round(lim.limit / before - 1, 3))
    assert raised == [0.05, 0.1, 0.2, 0.25, 0.25, 0.25]
    before = lim.limit
    for _ in range(20):
        lim.first_audio(t, 0.3)
    lim.observe(t + 0.5, 150)  # late again: cut, and the next raise is 5 % again
    cut = lim.limit
    assert cut == 0.9 * min(150, before)
    lim.observe(t + 1.0, int(cut))
    assert lim.limit == cut * 1.05


def cut_once(in_progress: int = 100) -> ConcurrencyLimit:
    """A limit cut at 0.5 s by a window of late first audios at `in_progress` requests in progress."""
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, in_progress)
    for _ in range(20):
        lim.first_audio(0.1, 0.3)
    lim.observe(0.5, in_progress)
    return lim


def test_an_arrival_refused_for_the_limit_makes_a_clean_window_raise_it_though_no_look_found_it_full():
    lim = cut_once()
    assert lim.limit == 90
    for window_end, refused in ((1.0, False), (1.5, True)):
        for _ in range(20):
            lim.first_audio(window_end - 0.4, 0.1)  # on time
        if refused:  # an arrival found 90 in progress between the looks, which find 80
            assert lim.refuses(90)
        lim.observe(window_end, 80)
        assert lim.limit == (90 * 1.05 if refused else 90)


def test_the_engines_guard_counts_its_refusals_between_looks_as_the_limit_binding():
    """The guard looks at the streams once a demand refresh: a refusal between two looks still makes the window a
    binding one, and the next clean look raises the limit."""
    cfg = SchedulerPolicyConfig(overload_mode="reject", max_decode_batch=512, demand_refresh_s=0.3)
    guard = OverloadGuard(cfg, CostModel())
    slow, queued = started(40, 0.1, 0.21), [waiting(f"w{i}") for i in range(4)]
    guard.check_arrival(0.0, waiting("a", arrival=0.0), slow, [])
    guard.check_arrival(0.5, waiting("b", arrival=0.5), slow, queued)  # a look: 44 in progress, late: cut
    assert guard.limit.limit == 0.9 * 44
    on_time = started(40, 0.6, 0.05, prefix="c")
    refusal = guard.check_arrival(0.6, waiting("d", arrival=0.6), on_time, [])  # no look (refreshed 0.1 s ago)
    assert refusal is not None and refusal.by_limit
    guard.check_arrival(1.1, waiting("e", arrival=1.1), on_time[:30], [])  # a look: 30 in progress, all on time
    assert guard.limit.limit == pytest.approx(0.9 * 44 * 1.05)


def test_a_late_first_audio_too_few_to_cut_restarts_the_doubling():
    lim = cut_once()
    shares, t = [], 0.5
    for late in (0, 0, 1, 0, 0):  # one late first audio in the third window: below `min_late`, no cut
        before = lim.limit
        for i in range(20):
            lim.first_audio(t, 0.3 if i < late else 0.1)
        t += 0.5
        lim.observe(t, int(lim.limit))
        shares.append(round(lim.limit / before - 1, 3))
    assert lim.misses == 1 and shares == [0.05, 0.1, 0.05, 0.1, 0.2]


def test_the_limit_never_falls_below_its_floor():
    lim = limit(floor=16)  # a few requests at a time, all late: the server stays idle, so no onset excuses them
    lim.observe(0.0, [], in_progress=4)
    lim.observe(0.5, started(4, 0.1, 0.3), in_progress=4)
    assert lim.limit.misses == 1 and lim.limit.limit == 16


def test_the_guard_refuses_past_the_learned_limit_and_says_why():
    cfg = SchedulerPolicyConfig(overload_mode="reject", max_decode_batch=512, demand_refresh_s=0.0)
    guard = OverloadGuard(cfg, CostModel())
    slow, queued = started(40, 0.1, 0.21), [waiting(f"w{i}") for i in range(4)]
    assert guard.check_arrival(0.0, waiting("a", arrival=0.0), slow, []) is None
    rejection = guard.check_arrival(0.5, waiting("b", arrival=0.5), slow, queued)
    assert guard.limit.limit == 0.9 * 44  # the 40 running and 4 waiting requests
    assert rejection is not None and "44 requests in progress" in rejection.reason
    assert rejection.retry_after_s == cfg.min_retry_after_s
    assert rejection.by_limit  # for the count alone: the API server may refuse the next arrivals itself
    decisions = guard.take_decisions()
    assert decisions[REFUSED_LIMIT] == 1 and decisions["limit cut: late"] == 1  # the step log names the trigger
    # a guard judging another SLO shares the limit and leaves its upkeep to the guard that made it
    other = OverloadGuard(cfg.replace(ttfa_target_s=1.0), CostModel(), guard.capacity, guard.limit)
    assert other.check_arrival(1.2, waiting("c", arrival=1.2), slow, queued) is not None
    assert guard.limit.misses == 1
    assert OverloadGuard(cfg.replace(feedback_limit=False), CostModel()).limit is None


def test_plain_numbers_judge_each_first_audio_against_its_own_target():
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, in_progress=50)
    for i in range(40):
        lim.first_audio(0.1, 0.5, target_s=1.0)  # late for T, in time for the target the request set
    lim.observe(0.5, in_progress=50, playing=40, dry=0)
    assert lim.misses == 0 and lim.limit == math.inf
    for _ in range(3):
        lim.first_audio(0.6, 0.25)  # three of three late against T
    lim.observe(1.0, in_progress=50, playing=40, dry=0)
    assert lim.misses == 1 and lim.limit == 45
    assert not lim.counts(0.9) and lim.counts(1.0)
    lim.first_audio(0.9, 5.0)  # arrived before the cut: no evidence
    lim.observe(1.5, in_progress=30, playing=1, dry=0)
    assert lim.misses == 1 and lim.limit == 45


def burst(lim, at, n, late):
    """`n` requests that arrived together at `at`, the first `late` of them past T."""
    for i in range(n):
        lim.first_audio(at, 0.3 if i < late else 0.1)


def test_a_burst_onto_an_idle_server_does_not_cut_and_an_overload_after_it_still_does():
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, 0)  # idle: the next busy spell's onset starts here
    lim.observe(0.05, 64)  # 64 arrived at once at 0.01
    burst(lim, 0.01, 64, late=9)  # their prefills queued: 9 late
    lim.observe(0.5, 58)
    assert lim.misses == 0 and lim.limit == math.inf
    # arrivals after the onset's half second are evidence again: an overload cuts one window later
    burst(lim, 0.6, 40, late=10)
    lim.observe(1.0, 120)
    assert lim.misses == 1 and lim.limit == 0.9 * 120 and lim.last_cut == "late: 10 of 40 first audios"


def test_the_same_burst_onto_a_busy_server_cuts():
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, 30)  # 30 in progress: above the floor, no onset
    lim.observe(0.05, 94)
    burst(lim, 0.01, 64, late=9)
    lim.observe(0.5, 88)
    assert lim.misses == 1 and lim.limit == 0.9 * 88


def test_each_return_from_idle_starts_an_onset_and_only_its_arrivals_are_exempt():
    lim = ConcurrencyLimit(LimitSettings(T, 16))
    lim.observe(0.0, 2)
    lim.observe(0.3, 40)  # onset: arrivals 0.0-0.5
    lim.observe(5.0, 3)  # idle again
    lim.observe(5.1, 50)  # a second onset: arrivals 5.0-5.5
    burst(lim, 5.2, 20, late=20)  # in the second onset: no evidence
    burst(lim, 2.0, 5, late=5)  # between the onsets (a request of the first spell, long in coming): evidence
    burst(lim, 0.2, 10, late=10)  # in the first onset, as long in coming: no evidence, past the newer onset
    lim.observe(5.6, 50)
    assert lim.misses == 1 and lim.last_cut == "late: 5 of 5 first audios"


def test_the_engines_streams_after_a_burst_onto_an_idle_engine_do_not_cut():
    lim = limit()
    lim.observe(0.0, [], in_progress=0)  # the next look is the first to see the burst
    burst_streams = started(55, 0.01, 0.15) + started(9, 0.01, 0.3, prefix="late")
    lim.observe(0.5, burst_streams, in_progress=64)
    assert lim.limit.misses == 0 and lim.limit.limit == math.inf
