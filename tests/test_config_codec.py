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
                                 "codec_gemm_wide_dilated_convs", "codec_layout_optimization", "codec_bounded_shapes",
                                 "codec_dynamic_frames", "codec_conv_1x1_as_mm", "codec_conv_tma"])
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


def test_codec_conv_kernels_is_off_tails_dilated_k7_or_all():
    assert VoxServeConfig().codec_conv_kernels == "k7" and VoxServeConfig().codec_layout_optimization
    assert not VoxServeConfig().codec_dynamic_frames  # the served form (H200, session 14)
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "off"}).codec_conv_kernels == "off"
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "tails"}).codec_conv_kernels == "tails"
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "dilated"}).codec_conv_kernels == "dilated"
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "k7"}).codec_conv_kernels == "k7"
    for bad in (True, "on", "ALL"):
        with pytest.raises(ValueError, match="voxserve.codec_conv_kernels must be off, tails, dilated, k7 or all"):
            VoxServeConfig.from_dict({"codec_conv_kernels": bad})


def test_the_tma_conv_kernel_is_served_and_a_switch():
    assert VoxServeConfig().codec_conv_tma  # the served form (H200, session 16)
    assert not VoxServeConfig.from_dict({"codec_conv_tma": False}).codec_conv_tma
    assert VoxServeConfig.from_dict({"codec_conv_kernels": "off"}).codec_conv_tma  # moot there, not an error


def test_codec_call_bounds_cover_every_call_the_server_makes():
    assert VoxServeConfig().codec_call_bounds() == (64, 10)  # background batches of 64, 10-frame chunks
    config = VoxServeConfig.from_dict({"chunk_frames": 12, "max_codec_batch": 128, "codec_rows_per_call": 16,
                                       "codec_bounded_shapes": True, "codec_dynamic_frames": False})
    assert config.codec_call_bounds() == (16, 12) and config.codec_bounded_shapes and not config.codec_dynamic_frames
    assert VoxServeConfig.from_dict({"lanes": {"background_max_batch": 256}}).codec_call_bounds() == (256, 10)
