import pytest

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig


def test_defaults_follow_the_paper():
    cfg = SchedulerPolicyConfig()
    assert (cfg.ttfa_target_s, cfg.urgent_margin_s, cfg.background_min_batch) == (0.2, 0.1, 8)
    assert cfg.max_prefill_deferral_s == 0.1
    assert (cfg.chunk_frames, cfg.frame_duration_s) == (10, 0.08)
    assert cfg.codec_sms == 32
    assert cfg.admission_mode == "deadline_aware" and cfg.deadline_aware


@pytest.mark.parametrize(
    "changes",
    [
        {"ttfa_target_s": 0},
        {"urgent_margin_s": -0.1},
        {"background_min_batch": 0},
        {"background_min_batch": 17, "background_max_batch": 16},
        {"max_prefill_deferral_s": -1},
        {"admission_mode": "fifo"},
        {"codec_admission": "yes"},
        {"overload_mode": "drop"},
        {"chunk_frames": 2.5},
        {"max_decode_batch": True},
        {"demand_horizons_s": ()},
        {"demand_horizons_s": (1.0, 0.0)},
        {"capacity_headroom": 1.5},
    ],
)
def test_bad_values_raise_value_error(changes):
    with pytest.raises(ValueError):
        SchedulerPolicyConfig(**changes)


def test_from_dict_round_trip_and_unknown_keys():
    cfg = SchedulerPolicyConfig.from_dict(
        {"urgent_margin_s": 0.05, "admission_mode": "prefill_first", "demand_horizons_s": [1, 2]}
    )
    assert cfg.urgent_margin_s == 0.05 and not cfg.deadline_aware
    assert cfg.demand_horizons_s == (1.0, 2.0)
    assert SchedulerPolicyConfig.from_dict(None) == SchedulerPolicyConfig()
    with pytest.raises(ValueError, match="unknown"):
        SchedulerPolicyConfig.from_dict({"delta_u": 0.1})


def test_config_is_frozen():
    cfg = SchedulerPolicyConfig()
    with pytest.raises(AttributeError):
        cfg.urgent_margin_s = 0.2  # type: ignore[misc]
    assert cfg.replace(background_min_batch=4).background_min_batch == 4
