"""The rank a speech request goes to under data parallelism, and the next one after a refusal (pure, simulated
clock: times are plain numbers)."""

from __future__ import annotations

import pytest

from vllm_voxserve.entrypoints.rank_choice import RankChoice


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
