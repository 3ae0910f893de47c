"""The codec's switches (internal fields), checked when the config is built (start-up), and the experiment switches
that were removed with their code: a config naming one fails at start-up, naming the key."""

import pytest

from vllm_voxserve.config import VoxServeConfig

REMOVED = {
    "codec_channels_last": True, "codec_gemm_low_rate_convs": True, "codec_gemm_wide_dilated_convs": False,
    "codec_gemm_dilated_min_channels": 1, "codec_rows_per_call": 16, "codec_conv_kernels": "off",
    "codec_conv_tma": False, "codec_conv_1x1_as_mm": True, "codec_layout_optimization": False,
    "codec_bounded_shapes": True, "codec_dynamic_frames": True,
}
REMOVED_NESTED = [("lanes", "lm_partition", True), ("lanes", "max_requests", 4),
                  ("scheduler", "forced_admission", "oldest"), ("scheduler", "count_late_requests", True),
                  ("scheduler", "waiting_deadlines", False)]


def test_the_codec_compiles_on_the_gpu_by_default():
    assert VoxServeConfig().codec_compile
    assert not VoxServeConfig.from_dict({}, internal={"codec_compile": False}).codec_compile


@pytest.mark.parametrize("key", ["codec_compile", "code_predictor_compile", "code_predictor_graphs",
                                 "code_predictor_kernels"])
def test_a_codec_switch_must_be_a_boolean(key):
    with pytest.raises(ValueError, match=f"voxserve.{key} must be true or false"):
        VoxServeConfig.from_dict({}, internal={key: "yes"})


@pytest.mark.parametrize("key", sorted(REMOVED))
def test_a_removed_codec_switch_fails_at_start_up_naming_it(key):
    assert not hasattr(VoxServeConfig(), key)
    with pytest.raises(ValueError, match=f"unknown voxserve keys \\['{key}'\\]"):
        VoxServeConfig.from_dict({key: REMOVED[key]})


@pytest.mark.parametrize(("section", "key", "value"), REMOVED_NESTED)
def test_a_removed_lanes_or_policy_switch_fails_at_start_up_naming_it(section, key, value):
    with pytest.raises(ValueError, match=key):
        VoxServeConfig.from_dict({section: {key: value}})
