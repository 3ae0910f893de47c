import pytest

from benchmarks.metrics import (
    COMPLETED, FAILED, REJECTED, TIMED_OUT, SloSpec, Timeline, attainment_percent, meets_slo, percentile,
    playback_pause_s, slo_capacity, stalled, summarize_rate, ttfa_s,
)
from benchmarks.sweep import format_rate_line

SLO = SloSpec(ttfa_target_s=0.200, stall_threshold_s=0.010)


def chunks(*pairs, sent=0.0, outcome=COMPLETED):
    times, audio = zip(*pairs) if pairs else ((), ())
    return Timeline(sent_s=sent, outcome=outcome, chunk_times_s=times, chunk_audio_s=audio)


def test_on_time_chunks_do_not_stall():
    # Each chunk arrives before the audio before it runs out.
    tl = chunks((0.1, 0.8), (0.5, 0.8), (1.6, 0.8))
    assert playback_pause_s(tl) == 0.0
    assert meets_slo(tl, SLO)


@pytest.mark.parametrize("late_ms, expect_stall", [(9.9, False), (10.1, True)])
def test_stall_just_under_and_over_10ms(late_ms, expect_stall):
    # First audio at 0.1 s carries 0.1 s, so the buffer runs dry at 0.2 s; the next chunk comes late_ms after.
    tl = chunks((0.1, 0.1), (0.2 + late_ms / 1000, 0.5))
    assert playback_pause_s(tl) == pytest.approx(late_ms / 1000)
    assert stalled(tl, SLO) is expect_stall
    assert meets_slo(tl, SLO) is not expect_stall


def test_pauses_add_up_and_push_later_deadlines_back():
    # Two 6 ms pauses: neither alone is a stall, together they are. The second chunk's pause delays playback,
    # so the third chunk's deadline is 0.306 + 0.1, not 0.3 + 0.1.
    tl = chunks((0.1, 0.1), (0.206, 0.1), (0.312, 0.1))
    assert playback_pause_s(tl) == pytest.approx(0.012)
    assert stalled(tl, SLO)
    on_time_after_pause = chunks((0.1, 0.1), (0.206, 0.1), (0.305, 0.1))
    assert playback_pause_s(on_time_after_pause) == pytest.approx(0.006)


def test_header_only_first_chunk_is_not_audio():
    # A WAV header at 50 ms carries no audio; the first audio comes at 250 ms, which misses a 200 ms target.
    tl = chunks((0.05, 0.0), (0.25, 0.8), (0.3, 0.8))
    assert ttfa_s(tl) == pytest.approx(0.25)
    assert not meets_slo(tl, SLO)
    # Empty chunks between audio do not create stalls or shift the player.
    tl2 = chunks((0.05, 0.0), (0.15, 0.1), (0.2, 0.0), (0.24, 0.1))
    assert ttfa_s(tl2) == pytest.approx(0.15) and playback_pause_s(tl2) == 0.0


def test_ttfa_counts_from_sending():
    tl = chunks((10.15, 0.8), sent=10.0)
    assert ttfa_s(tl) == pytest.approx(0.15)
    assert meets_slo(tl, SLO)


@pytest.mark.parametrize("first_s, meets", [(0.199, True), (0.2, True), (0.201, False), (0.9, False)])
def test_late_first_chunk(first_s, meets):
    assert meets_slo(chunks((first_s, 1.0)), SLO) is meets


@pytest.mark.parametrize("outcome", [REJECTED, FAILED, TIMED_OUT])
def test_unfinished_requests_are_misses_even_with_good_audio(outcome):
    assert not meets_slo(chunks((0.05, 0.8), outcome=outcome), SLO)


def test_rejected_requests_count_in_attainment_and_goodput():
    good = chunks((0.05, 0.8))
    rejected = Timeline(sent_s=0.0, outcome=REJECTED)
    stalled_tl = chunks((0.05, 0.1), (0.5, 0.8))
    s = summarize_rate(4.0, 10.0, [good, good, rejected, stalled_tl], SLO)
    assert (s.num_requests, s.num_met, s.num_rejected, s.num_completed, s.num_stalled) == (4, 2, 1, 3, 1)
    assert s.attainment == pytest.approx(0.5)
    assert s.goodput == pytest.approx(0.2)  # 2 met over a 10 s window
    assert s.throughput == pytest.approx(0.3)
    assert s.audio_within_1s == pytest.approx(0.75)  # the rejected one got no audio
    assert s.ttfa_p50_s == pytest.approx(0.05)


def test_capacity_with_a_dip_at_a_middle_rate():
    attainment = {2: 1.0, 4: 0.995, 6: 0.97, 8: 0.85, 10: 0.95, 12: 0.4}
    # 10 req/s is above 90% again, but 8 below it already ended the capacity.
    assert slo_capacity(attainment, 0.90) == 6
    assert slo_capacity(attainment, 0.99) == 4
    assert slo_capacity({2: 0.5, 4: 1.0}, 0.90) == 0.0
    assert slo_capacity({}, 0.90) == 0.0
    assert slo_capacity({4: 0.90}, 0.90) == 4  # "at or above"


def test_capacity_pools_seeds_per_rate():
    # Seed A meets 10/10 at 4 req/s, seed B 8/10: pooled 90% -> passes 90%, fails 99%.
    ok, miss = chunks((0.05, 0.8)), chunks((0.5, 0.8))
    pooled = summarize_rate(4.0, 20.0, [ok] * 10 + [ok] * 8 + [miss] * 2, SLO)
    assert pooled.attainment == pytest.approx(0.9)
    assert slo_capacity({4.0: pooled.attainment}, 0.90) == 4.0
    assert slo_capacity({4.0: pooled.attainment}, 0.99) == 0.0


def test_percentile_matches_linear_interpolation():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 99) == pytest.approx(4.96)
    assert percentile([], 99) is None


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError):
        Timeline(sent_s=0, outcome="weird")
    with pytest.raises(ValueError):
        Timeline(sent_s=0, outcome=COMPLETED, chunk_times_s=(0.2, 0.1), chunk_audio_s=(1.0, 1.0))
    with pytest.raises(ValueError):
        SloSpec(ttfa_target_s=0)
    with pytest.raises(ValueError):
        slo_capacity({1: 1.0}, 1.5)


@pytest.mark.parametrize("met, total, shown", [(9868, 9969, "98.9"), (9969, 9969, "100.0"), (57, 100, "57.0"),
                                                (29, 100, "29.0"), (99, 100, "99.0"), (9999, 10000, "99.9"),
                                                (0, 5, "0.0")])
def test_attainment_is_shown_rounded_down(met, total, shown):
    # a rate that missed 99 % by a hundredth of a point once printed as 99.0 %, the threshold it missed
    assert attainment_percent(met / total) == shown


def test_the_sweep_line_never_shows_a_missed_threshold_as_met():
    timelines = [chunks((0.1, 5.0))] * 9868 + [Timeline(sent_s=0.0, outcome=REJECTED)] * 101
    line = format_rate_line(summarize_rate(112, 90.0, timelines, SLO))
    assert "attainment 98.9% (9868/9969)" in line
