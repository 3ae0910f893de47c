"""The API server's edge guard on a simulated clock: refusals at arrival past the learned limit, recovery, the floor."""

from __future__ import annotations

import math

import pytest

from vllm_voxserve.entrypoints.edge_admission import AdmissionTicket, EdgeGuard, EdgeRefusal
from vllm_voxserve.scheduler.concurrency_limit import LimitSettings
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

T = 0.2
FLOOR = 16


def guard(**settings) -> EdgeGuard:
    return EdgeGuard(LimitSettings(T, FLOOR, **settings), retry_after_s=1.0)


def arrivals(g: EdgeGuard, start: float, rate: float, seconds: float) -> tuple[list[AdmissionTicket], list]:
    """Requests arriving every 1/rate s from `start` for `seconds`: (admitted tickets, refusals)."""
    admitted, refused = [], []
    for i in range(round(rate * seconds)):
        answer = g.admit(start + i / rate)
        (refused if isinstance(answer, EdgeRefusal) else admitted).append(answer)
    return admitted, refused


def busy_guard(**settings) -> EdgeGuard:
    """A guard with 20 requests in progress since before 0, on time and still playing: loads from 0 on are not
    bursts onto an idle server (whose first audios are no evidence)."""
    g = guard(**settings)
    hear(arrivals(g, -2.0, 200, 0.1)[0], 0.1, play_s=10.0)
    return g


def hear(tickets: list[AdmissionTicket], ttfa: float, play_s: float = 5.0) -> None:
    """Each request's first audio `ttfa` after its arrival, with `play_s` of audio handed out with it."""
    for ticket in tickets:
        ticket.first_audio(ticket.arrival_time + ttfa)
        ticket.playing_until(ticket.arrival_time + ttfa + play_s)


def test_no_limit_before_the_first_late_window():
    g = guard()
    admitted, refused = arrivals(g, 0.0, 400, 1.0)
    hear(admitted, 0.1)
    more, refused_more = arrivals(g, 1.0, 400, 1.0)
    assert refused == refused_more == [] and g.in_progress == 800 and g.limit.limit == math.inf


def test_a_burst_above_capacity_is_refused_at_arrival_after_a_miss_window():
    g = busy_guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)  # 100 more in progress, every first audio late
    hear(admitted, 0.3)
    answer = g.admit(0.56)  # the next look closes the window: cut to 0.9 of the 120 in progress
    assert isinstance(answer, EdgeRefusal)
    assert g.limit.limit == 108 and g.limit.misses == 1
    assert "120 requests in progress at this API server" in answer.reason and "108" in answer.reason
    assert answer.retry_after_s == 1.0
    later, refused = arrivals(g, 0.57, 200, 0.2)  # the burst goes on: refused while nobody leaves
    assert later == [] and len(refused) == 40
    for ticket in admitted[:20]:  # 20 leave: 100 in progress, room for 8 more
        ticket.done(0.8)
    room, refused = arrivals(g, 0.8, 200, 0.1)
    assert len(room) == 8 and len(refused) == 12 and g.in_progress == 108


def test_each_cut_is_logged_with_what_made_it(caplog):
    g = busy_guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    hear(admitted[:97], 0.1)
    hear(admitted[97:], 0.3)  # 3 of 100 first audios late, the last three arrivals
    with caplog.at_level("INFO", logger="vllm_voxserve.entrypoints.edge_admission"):
        g.admit(0.56)
    assert g.limit.misses == 1
    assert "in-progress limit cut to 108 at 120 in progress (late: 3 of 100 first audios)" in caplog.text


def test_a_burst_onto_an_idle_api_server_does_not_cut():
    g = guard()
    burst = [g.admit(0.0) for _ in range(64)]  # 64 at once onto an idle server
    hear(burst[:55], 0.15)
    hear(burst[55:], 0.3)  # their prefills queued: 9 late
    later, refused = arrivals(g, 0.6, 100, 0.5)
    assert refused == [] and g.limit.misses == 0 and g.limit.limit == math.inf


def test_recovery_raises_the_limit_again():
    g = busy_guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    hear(admitted, 0.3)
    g.admit(0.56)
    assert g.limit.limit == 108
    for ticket in admitted[:10]:
        ticket.done(0.55)
    limits = []
    for window in range(1, 5):  # each window: at the limit, every admitted first audio on time
        start = 0.5 + 0.5 * window
        admitted_now, _ = arrivals(g, start - 0.49, 100, 0.4)
        hear(admitted_now, 0.1)
        for ticket in admitted_now:
            ticket.done(start - 0.05)
        g.admit(start)  # closes the window: clean, and the limit bound
        limits.append(g.limit.limit)
    assert limits == sorted(limits) and limits[-1] > 108 and g.limit.misses == 1


def test_dry_streams_cut_the_limit():
    g = guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    hear(admitted, 0.1, play_s=0.2)  # on time, but the audio handed out ran out at ≈ 0.3-0.8 s
    g.admit(0.56)
    assert g.limit.misses == 1 and g.limit.limit == 0.9 * 100


def test_audio_a_few_ms_overdue_is_not_dry_yet():
    g = guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    hear(admitted, 0.1, play_s=0.42)  # on time; the audio handed out runs out at 0.52-1.015 s
    g.admit(0.56)  # the window closes: the first 8 streams are 5-40 ms dry, within the grace
    assert g.limit.misses == 0
    g.admit(0.62)  # now the first 10 are more than 50 ms dry
    g.admit(1.07)  # the next window closes
    assert g.limit.misses == 1


def test_streams_still_playing_and_first_audio_within_a_requests_own_target_are_no_miss():
    g = guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    for ticket in admitted:
        ticket.target_s = 1.0  # the requests asked for a looser target than T
    hear(admitted, 0.6)
    g.admit(0.56)
    assert g.limit.misses == 0


def test_a_burst_on_an_idle_server_below_the_floor_is_admitted():
    g = guard()
    first = [g.admit(0.0) for _ in range(17)]  # a burst onto the idle server: no evidence
    hear(first, 0.1)
    late, _ = arrivals(g, 0.6, 100, 0.03)  # 3 arriving while 17 are in progress, all late
    hear(late, 1.0)
    for ticket in first[:5]:
        ticket.done(0.7)
    g.admit(1.2)  # closes the window at 15 in progress
    assert g.limit.misses == 1 and g.limit.limit == FLOOR  # 0.9 * 15 is below the floor
    for ticket in g.tickets.copy():
        ticket.done(2.0)
    burst, refused = arrivals(g, 2.0, 10_000, 40 / 10_000)  # 40 within 4 ms
    assert len(burst) == math.ceil(g.limit.limit) >= FLOOR and len(refused) == 40 - len(burst)


def test_a_ticket_ends_once_however_often_it_is_told():
    g = guard()
    ticket = g.admit(0.0)
    ticket.first_audio(0.1)
    ticket.first_audio(5.0)  # later calls change nothing
    assert ticket.first_audio_time == 0.1
    ticket.done(1.0)
    ticket.done(1.1)
    assert g.in_progress == 0


def test_off_with_overload_off_or_edge_admission_off_and_on_by_default():
    assert EdgeGuard.from_policy(SchedulerPolicyConfig()).limit is not None
    for cfg in (SchedulerPolicyConfig(overload_mode="off"), SchedulerPolicyConfig(edge_admission=False)):
        g = EdgeGuard.from_policy(cfg)
        admitted, refused = arrivals(g, 0.0, 200, 0.5)
        hear(admitted, 5.0)
        admitted, refused = arrivals(g, 0.5, 200, 2.0)
        assert g.limit is None and refused == [] and g.in_progress == 500
    cfg = SchedulerPolicyConfig(limit_floor=3, min_retry_after_s=2.5, ttfa_target_s=0.5)
    g = EdgeGuard.from_policy(cfg)
    assert g.limit.settings.floor == 3 and g.limit.settings.ttfa_target_s == 0.5 and g.retry_after_s == 2.5


def test_what_the_engines_limit_would_refuse_is_refused_here_without_a_ticket_even_with_the_limit_off():
    for g in (guard(), EdgeGuard(LimitSettings(0.2, floor=1), retry_after_s=1.0, enabled=False)):
        answer = g.admit(0.0, ("server at capacity: 3 requests in progress at this API server", 0.2))
        assert isinstance(answer, EdgeRefusal) and answer.retry_after_s == 0.2 and g.in_progress == 0
        assert isinstance(g.admit(0.0), AdmissionTicket) and g.in_progress == 1


def test_the_guard_keeps_each_first_audios_time_from_the_routes_entry_for_the_load_line_with_the_limit_on_or_off():
    for g in (guard(), EdgeGuard(LimitSettings(T, FLOOR), retry_after_s=1.0, enabled=False)):
        first, second = g.admit(1.0), g.admit(1.5)
        first.first_audio(1.12)
        first.first_audio(1.3)  # a later call is no first audio
        second.first_audio(1.74)
        assert [round(s, 3) for s in g.take_first_audio_s()] == [0.12, 0.24]
        assert g.take_first_audio_s() == []  # taken once


def test_an_arrival_the_edge_refuses_for_its_limit_makes_the_window_a_binding_one():
    g = busy_guard()
    admitted, _ = arrivals(g, 0.0, 200, 0.5)
    hear(admitted, 0.3)
    admitted[0].done(0.56)  # its look closes the late window: cut to 0.9 of the 119 in progress
    cut = g.limit.limit
    assert cut == pytest.approx(0.9 * 119)
    for ticket in admitted[1:21]:
        ticket.done(0.57)  # before the next look: 99 in progress at the looks from here
    assert isinstance(g.admit(1.06), AdmissionTicket) and g.limit.limit == cut  # nothing found it full: as it was
    new = [g.admit(1.061 + i * 0.001) for i in range(8)]  # 108 in progress within one look's interval
    assert isinstance(g.admit(1.07), EdgeRefusal)  # refused between two looks, which saw 99 and will see 78
    for ticket in admitted[21:51]:
        ticket.done(1.075)  # still before the next look
    hear(new, 0.1)
    g.admit(1.6)  # the look that closes the clean window
    assert g.limit.limit == pytest.approx(cut * 1.05)
