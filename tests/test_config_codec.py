"""The codec's switches in `voxserve` (top level), checked when the config is built (start-up)."""

import pytest

from vllm_voxserve.config import VoxServeConfig


def test_codec_layout_switches_default_as_timed_and_parse():
    default = VoxServeConfig()
    assert (default.codec_compile, default.codec_channels_last, default.codec_gemm_low_rate_convs,
            default.codec_gemm_wide_dilated_convs) == (True, False, False, True)
    config = VoxServeConfig.from_dict({"codec_channels_last": True, "codec_gemm_low_rate_convs": True,
                                       "codec_gemm_wide_dilated_convs": False})
    assert (config.codec_channels_last, config.codec_gemm_low_rate_convs,
            config.codec_gemm_wide_dilated_convs) == (True, True, False)


@pytest.mark.parametrize("key", ["codec_compile", "codec_channels_last", "codec_gemm_low_rate_convs",
                                 "codec_gemm_wide_dilated_convs"])
def test_a_codec_switch_must_be_a_boolean(key):
    with pytest.raises(ValueError, match=f"voxserve.{key} must be true or false"):
        VoxServeConfig.from_dict({key: "yes"})


def test_codec_rows_per_call_is_a_non_negative_integer():
    assert VoxServeConfig().codec_rows_per_call == 0  # the whole batch in one call
    assert VoxServeConfig.from_dict({"codec_rows_per_call": 16}).codec_rows_per_call == 16
    for bad in (-1, 1.5, True, "16"):
        with pytest.raises(ValueError, match="voxserve.codec_rows_per_call must be a non-negative integer"):
            VoxServeConfig.from_dict({"codec_rows_per_call": bad})
