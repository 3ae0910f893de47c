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
                                 "codec_gemm_wide_dilated_convs", "codec_layout_optimization"])
def test_a_codec_switch_must_be_a_boolean(key):
    with pytest.raises(ValueError, match=f"voxserve.{key} must be true or false"):
        VoxServeConfig.from_dict({key: "yes"})


@pytest.mark.parametrize(("key", "default", "least"), [("codec_rows_per_call", 0, 0),
                                                        ("codec_gemm_dilated_min_channels", 512, 1)])
def test_codec_integer_settings_parse_and_are_checked(key, default, least):
    assert getattr(VoxServeConfig(), key) == default
    assert getattr(VoxServeConfig.from_dict({key: 16}), key) == 16
    for bad in (least - 1, 1.5, True, "16"):
        with pytest.raises(ValueError, match=f"voxserve.{key} must be an integer >= {least}"):
            VoxServeConfig.from_dict({key: bad})


def test_codec_conv_kernels_is_off_tails_or_all():
    assert VoxServeConfig().codec_conv_kernels == "off" and VoxServeConfig().codec_layout_optimization
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "tails"}).codec_conv_kernels == "tails"
    for bad in (True, "on", "ALL"):
        with pytest.raises(ValueError, match="voxserve.codec_conv_kernels must be off, tails or all"):
            VoxServeConfig.from_dict({"codec_conv_kernels": bad})
