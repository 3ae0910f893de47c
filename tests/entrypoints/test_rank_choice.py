"""The rank a speech request goes to under data parallelism, and the next one after a refusal (pure, simulated
clock: times are plain numbers)."""

from __future__ import annotations

import pytest

from vllm_voxserve.entrypoints.rank_choice import LIMIT_MARK_S, RankChoice


def test_idle_ranks_take_turns_and_the_least_loaded_rank_takes_the_next_request():
    ranks = RankChoice(3)
    picked = []
    for _ in range(3):
        rank = ranks.pick(0.0)
        ranks.opened(rank)
        picked.append(rank)
    assert sorted(picked) == [0, 1, 2]
    ranks.closed(picked[1])
    assert ranks.pick(0.0) == picked[1]  # the only rank with a free stream


def test_a_refused_request_goes_to_an_untried_rank_and_gives_up_when_all_refused():
    ranks = RankChoice(2)
    first = ranks.pick(0.0)
    ranks.opened(first)
    ranks.refused(first, 0.0, retry_after_s=1.0)
    second = ranks.pick(0.0, {first})
    assert second != first
    ranks.opened(second)
    ranks.refused(second, 0.0, retry_after_s=1.0)
    assert ranks.pick(0.0, {first, second}) is None
    assert ranks.open_streams == [0, 0]


def test_a_rank_that_refused_is_avoided_until_its_retry_after_passes():
    ranks = RankChoice(2)
    ranks.opened(0)
    ranks.refused(0, now=10.0, retry_after_s=2.0)
    for _ in range(3):  # rank 1 is preferred however loaded, while rank 0 counts as full
        rank = ranks.pick(11.0)
        assert rank == 1
        ranks.opened(rank)
    assert ranks.pick(12.5) == 0  # Retry-After has passed: the load counts again


def test_a_stream_ending_on_a_full_rank_frees_it_at_once():
    ranks = RankChoice(2)
    ranks.opened(0)
    ranks.opened(0)
    ranks.refused(0, now=0.0, retry_after_s=30.0)
    ranks.opened(1)
    ranks.opened(1)
    assert ranks.pick(1.0) == 1
    ranks.opened(1)
    ranks.closed(0)  # a slot on rank 0 is free again
    assert ranks.pick(1.0) == 0


def test_every_rank_known_full_still_gets_requests_least_loaded_first():
    ranks = RankChoice(2)
    ranks.opened(0)
    for rank in (0, 1):
        ranks.opened(rank)
        ranks.refused(rank, now=0.0, retry_after_s=5.0)
    assert ranks.pick(1.0) == 1  # both full: the one with fewer streams
    assert ranks.pick(1.0, {1}) == 0


def test_one_rank_is_the_single_engine():
    ranks = RankChoice(1)
    assert ranks.pick(0.0) == 0
    assert ranks.pick(0.0, {0}) is None
    with pytest.raises(ValueError, match="num_ranks"):
        RankChoice(0)


def test_a_refusal_by_the_in_progress_limit_holds_while_as_many_streams_are_open_for_a_short_while():
    ranks = RankChoice(1)
    for _ in range(4):
        ranks.opened(0)
    ranks.refused(0, now=10.0, retry_after_s=1.0, by_limit=True)  # refused at 3 open streams
    assert ranks.at_limit(10.1) == (3, pytest.approx(LIMIT_MARK_S - 0.1))
    ranks.closed(0)  # a slot freed: the next arrival goes to the engine
    assert ranks.at_limit(10.1) is None
    ranks.opened(0)  # ... and with it as many open as when the engine refused
    assert ranks.at_limit(10.2) == (3, pytest.approx(LIMIT_MARK_S - 0.2))
    assert ranks.at_limit(10.0 + LIMIT_MARK_S) is None  # the engine's limit may have risen: ask it again
    ranks.refused(0, now=20.0, retry_after_s=0.1, by_limit=True)  # a shorter Retry-After bounds the mark
    assert ranks.at_limit(20.05) is not None and ranks.at_limit(20.1) is None


def test_a_refusal_for_the_load_marks_no_count():
    """One very long request refused for the frames it needs says nothing about the next arrival."""
    ranks = RankChoice(1)
    ranks.opened(0)
    ranks.refused(0, now=0.0, retry_after_s=5.0)
    assert ranks.at_limit(0.0) is None and ranks.pick(0.0) == 0


def test_arrivals_are_refused_here_only_while_every_rank_is_at_its_limit():
    ranks = RankChoice(2)
    for rank in (0, 1):
        ranks.opened(rank)
        ranks.opened(rank)
        ranks.refused(rank, now=0.0, retry_after_s=1.0, by_limit=rank == 0)
    assert ranks.at_limit(0.1) is None  # rank 1 refused for its load: the next arrival still asks a rank
    ranks.opened(1)
    ranks.refused(1, now=0.1, retry_after_s=1.0, by_limit=True)
    assert ranks.at_limit(0.15) == (2, pytest.approx(LIMIT_MARK_S - 0.15))  # the sooner mark's lapse
