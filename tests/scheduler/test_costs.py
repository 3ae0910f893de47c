import pytest

from vllm_voxserve.scheduler.costs import CostModel, LinearCost, paper_h100_seed
from vllm_voxserve.contract import CostSample


def test_seed_passes_through_the_papers_codec_figures():
    seed = paper_h100_seed(codec_sms=24)
    assert seed.urgent_codec(1) == pytest.approx(1.9e-3)
    assert seed.urgent_codec(16) == pytest.approx(10e-3)
    assert seed.background_codec(1) == pytest.approx(5.0e-3)
    assert seed.background_codec(16) == pytest.approx(49e-3)
    # more SMs for the codec lane: faster, by the stated compute-bound scaling
    assert paper_h100_seed(32).background_codec(16) == pytest.approx(49e-3 * 24 / 32)


def test_lm_seed_matches_the_derivation_in_its_docstring():
    seed = paper_h100_seed()
    per_request = seed.prefill(8 * 40) / 8 + 97.5 * seed.decode(64) / 64
    assert 1 / per_request == pytest.approx(48, rel=0.02)  # req/s at which the LM saturates (§4.7)


def test_observed_costs_move_the_estimate():
    model = CostModel(smoothing=0.5)
    before = model.decode_step_s(32)
    for _ in range(20):
        model.observe(CostSample("decode", 32, 2 * before))
    assert model.decode_step_s(32) == pytest.approx(2 * before, rel=1e-3)
    assert model.decode_step_s(64) > model.decode_step_s(32)  # the shape stays the seed's
    assert model.prefill_s(100) == pytest.approx(paper_h100_seed().prefill(100))  # other kinds untouched


def test_linear_cost_through_two_points():
    line = LinearCost.through(1, 2.0, 3, 4.0)
    assert (line.fixed_s, line.per_item_s) == (1.0, 1.0)
    with pytest.raises(ValueError):
        CostModel(smoothing=0)
    with pytest.raises(ValueError):
        CostSample("encode", 1, 1.0)


def test_a_prefill_is_charged_what_it_adds_to_the_decode_step_it_rides_in():
    """A step with a prefill and 150 decoding rows took 15 ms; the decode line says 150 rows alone take about that:
    the prefill's own estimate must not become the whole step (the H200's learned cost did: run 2026-12-02_f0a91d7)."""
    costs = CostModel(smoothing=1.0)
    decode_alone = costs.decode_step_s(150)
    costs.observe(CostSample("prefill", 100, decode_alone + 0.001, decode_rows=150))
    assert costs.prefill_s(100) == pytest.approx(0.001)
    costs.observe(CostSample("prefill", 100, decode_alone / 2, decode_rows=150))  # faster than the line: no cost
    assert costs.prefill_s(100) == 0.0
    costs.observe(CostSample("prefill", 100, 0.015))  # a step of prefills alone is all prefill
    assert costs.prefill_s(100) == pytest.approx(0.015)
    with pytest.raises(ValueError, match="bad cost sample"):
        CostSample("prefill", 100, 0.01, decode_rows=-1)


def test_the_planner_seeds_its_cost_model_as_configured():
    from vllm_voxserve.scheduler.costs import h200_seed, paper_h100_seed
    from vllm_voxserve.scheduler.planner import Planner
    from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

    assert Planner(SchedulerPolicyConfig(cost_seed="h200")).costs.seed == h200_seed()
    assert Planner(SchedulerPolicyConfig(codec_sms=64)).costs.seed == paper_h100_seed(64)
    with pytest.raises(ValueError, match="cost_seed"):
        SchedulerPolicyConfig(cost_seed="a100")
