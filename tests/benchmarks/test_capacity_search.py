import asyncio

import pytest

from benchmarks.capacity_search import SearchConfig, search_capacity
from benchmarks.client import make_profile
from benchmarks.sweep import LoadConfig


def monotone(true_capacity):
    """Attainment 1.0 up to true_capacity, then falling; records every probe."""
    probes = []

    async def evaluate(rate):
        probes.append(rate)
        return 1.0 if rate <= true_capacity else max(0.0, 1.0 - 0.1 * (rate - true_capacity))

    return evaluate, probes


def search(evaluate, threshold=0.9, start=8, resolution=2, max_rate=256, known=None):
    return asyncio.run(search_capacity(evaluate, threshold, start, resolution, max_rate,
                                       {} if known is None else known))


@pytest.mark.parametrize("true_capacity", [2, 6, 8, 14, 30, 46, 100])
def test_search_finds_the_grid_capacity(true_capacity):
    evaluate, probes = monotone(true_capacity)
    assert search(evaluate) == true_capacity
    assert len(probes) <= 10 and len(set(probes)) == len(probes)


def test_lowest_rate_already_misses():
    evaluate, probes = monotone(0)
    assert search(evaluate) == 0.0
    assert probes == [8, 6, 2]


def test_a_start_just_past_capacity_settles_one_grid_step_below():
    """Run 2026-12-02_f0a91d7's searches, 200 s each: `lanes` from 104 probed 48 and 80 after missing at 104, stock
    from 40 went to 16. Stepping down from a start that misses settles a capacity just below it in one more probe."""
    evaluate, probes = monotone(96)
    assert search(evaluate, start=104, resolution=8) == 96
    assert probes == [104, 96]
    evaluate, probes = monotone(64)  # farther below: 96, 80, 48 (steps of 8, 16, 32), then bisect 48-80
    assert search(evaluate, start=104, resolution=8) == 64
    assert probes == [104, 96, 80, 48, 64, 72]


def test_never_misses_up_to_max_rate():
    evaluate, probes = monotone(1000)
    assert search(evaluate, max_rate=100) == 100
    assert probes == [8, 16, 32, 64, 100]


def test_second_threshold_reuses_probes():
    known = {}
    evaluate, probes = monotone(20)  # attainment 0.9 at 21... on the 2-grid: 22 -> 0.8, 20 -> 1.0
    assert search(evaluate, threshold=0.99, known=known) == 20
    first = len(probes)
    assert search(evaluate, threshold=0.90, known=known) == 20
    assert len(probes) == first  # everything needed was already probed


def test_search_windows_must_be_long_enough():
    load = LoadConfig(base_url="http://127.0.0.1:1", profile=make_profile("ours"), window_s=10)
    with pytest.raises(ValueError):
        SearchConfig(load=load)
    assert SearchConfig(load=load, allow_short_window=True).load.window_s == 10


def test_ablation_chain_start_uses_previous_capacity():
    from benchmarks.ablation import AblationConfig, _search_for
    from benchmarks.capacity_search import SearchResult

    load = LoadConfig(base_url="http://127.0.0.1:1", profile=make_profile("ours"), window_s=20)
    search = SearchConfig(load=load, start_rate=8, resolution=2, max_rate=64)
    chained = AblationConfig(modes=("a", "b"), search=search, chain_start=True)
    assert _search_for(chained, {}, "a") is search
    done = {"a": SearchResult(window_s=20, capacity={"0.99": 10.0, "0.90": 14.0})}
    assert _search_for(chained, done, "b").start_rate == 14.0
    done["a"].capacity["0.90"] = 0.0
    assert _search_for(chained, done, "b").start_rate == 2.0
    assert _search_for(AblationConfig(modes=("a",), search=search), done, "a").start_rate == 8


def test_ablation_chain_start_after_an_unsettled_search_uses_the_highest_rate_it_met():
    """A previous mode whose budget ran out before its capacity settled: start at its best passing rate, not at the
    lowest rate (run 2026-12-01_2a42666 lost its `lanes` budget climbing 8, 16, 32 after `vllm-stock` met 40
    unsettled)."""
    from benchmarks.ablation import AblationConfig, _search_for
    from benchmarks.capacity_search import SearchResult
    from benchmarks.metrics import RateSummary

    def summary(rate, attainment):
        return RateSummary(rate=rate, window_s=60, num_requests=100, num_completed=100, num_rejected=0,
                           num_failed=0, num_stalled=0, num_met=round(100 * attainment), attainment=attainment,
                           goodput=rate * attainment, throughput=rate, audio_within_1s=1.0, ttfa_p50_s=0.1,
                           ttfa_p90_s=0.1, ttfa_p99_s=0.1, ttfa_mean_s=0.1)

    load = LoadConfig(base_url="http://127.0.0.1:1", profile=make_profile("ours"), window_s=20)
    search = SearchConfig(load=load, start_rate=16, resolution=8, max_rate=256)
    chained = AblationConfig(modes=("a", "b"), search=search, chain_start=True)
    unsettled = SearchResult(window_s=20, stop_reason="time budget", capacity={"0.99": 32.0},
                             summaries=[summary(40, 0.91), summary(16, 0.99), summary(32, 0.999), summary(80, 0.2)])
    assert _search_for(chained, {"a": unsettled}, "b").start_rate == 40
    nothing_met = SearchResult(window_s=20, stop_reason="time budget", summaries=[summary(40, 0.5)])
    assert _search_for(chained, {"a": nothing_met}, "b") is search
    with pytest.raises(ValueError):
        AblationConfig(modes=("a",))


def test_a_mode_start_rate_overrides_the_chained_one():
    """One server measures `vllm-stock` then `lanes`: each starts at its own known bracket, not lanes at stock's."""
    from benchmarks.ablation import AblationConfig, _search_for
    from benchmarks.capacity_search import SearchResult
    from benchmarks.cli import build_parser

    load = LoadConfig(base_url="http://127.0.0.1:1", profile=make_profile("ours"), window_s=20)
    search = SearchConfig(load=load, start_rate=16, resolution=8, max_rate=256)
    args = build_parser().parse_args(["ablation", "--modes", "a,b", "--mode-start-rates", "b=88"])
    config = AblationConfig(modes=("a", "b"), search=search, chain_start=True, start_rates=args.mode_start_rates)
    done = {"a": SearchResult(window_s=20, capacity={"0.99": 32.0, "0.90": 40.0})}
    assert _search_for(config, {}, "a") is search
    assert _search_for(config, done, "b").start_rate == 88
    with pytest.raises(ValueError):
        AblationConfig(modes=("a",), search=search, start_rates={"c": 8})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ablation", "--mode-start-rates", "b88"])
