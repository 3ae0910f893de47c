"""Past capacity on an H200-shaped simulated GPU (costs.h200_seed, sweep.H200_GPU): admission that weighs the codec
lane keeps goodput near capacity at 1.5x and 2x it, with admitted requests on time; weighing the backbone alone
admits what the codec lane cannot decode. Short windows and one seed: orderings and margins, not the protocol's
numbers (`python -m benchmarks.simulation --gpu h200`, benchmarks/simulation/README.md)."""

import functools

import pytest

from benchmarks.simulation.sweep import H200_GPU, H200_POLICY, capacity, simulate_rate, sweep
from benchmarks.simulation.workload import load_word_counts

WINDOW_S = 20.0  # shorter windows end before a run past capacity builds its backlog
RATES = (150.0, 170.0, 190.0, 210.0)

pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def capacity_without_shedding():
    return capacity(sweep("deadline_aware", RATES, WINDOW_S, base=H200_POLICY, gpu=H200_GPU,
                          word_counts=load_word_counts()))


@functools.lru_cache(maxsize=None)
def at(mode, factor):
    return simulate_rate(mode, factor * capacity_without_shedding(), WINDOW_S, base=H200_POLICY, gpu=H200_GPU,
                         word_counts=load_word_counts())


def test_the_sweep_brackets_the_capacity():
    assert RATES[0] <= capacity_without_shedding() < RATES[-1]


@pytest.mark.parametrize("factor", [1.5, 2.0])
def test_goodput_past_capacity_stays_near_it_with_admitted_requests_on_time(factor):
    result = at("deadline_aware_shed", factor)
    assert result.goodput >= 0.9 * capacity_without_shedding()
    assert result.ttfa_p99_ms <= 1000 * H200_POLICY.ttfa_target_s  # only admitted requests have a first audio
    admitted = result.offered - result.rejected
    assert result.met >= 0.97 * admitted
    assert result.rejected >= 0.2 * result.offered  # the excess is refused, not queued


def test_weighing_the_backbone_alone_admits_what_the_codec_cannot_decode():
    codec_aware, backbone_only = at("deadline_aware_shed", 1.5), at("deadline_aware_shed_backbone", 1.5)
    assert backbone_only.goodput < 0.8 * codec_aware.goodput
    assert backbone_only.stalled > 5 * max(codec_aware.stalled, 1)
