"""The k7 convs' TMA kernel (time-major input): against the tensor code in the Triton interpreter on CPU and compiled on
GPU, and a decoder whose k7 convs run on it streaming its full decode (the compiled real-shaped decoder on it:
test_codec_conv_kernels' GPU test)."""

import copy

import pytest
import torch

from tests.models.qwen3_tts.test_codec_conv_kernels import streamed_deviation
from tests.models.qwen3_tts.test_codec_streaming import SMALL_WINDOW_CONFIG
from tests.models.qwen3_tts.test_cp_kernels import interpret
from vllm_voxserve.models.qwen3_tts.codec import conv_kernels, tma_conv
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import ResidualUnit, use_conv_kernels

# (channels, out channels, dilation, input columns, bias): the served residual units' k7 shapes at dilations 1/3/9
# (96: fewer output channels than a 128-row block, whose other rows read the next tap's weights), columns that are no
# multiple of a tile, fewer output than input channels
CASES = [(96, 96, 9, 300, True), (48, 16, 3, 50, False), (64, 64, 1, 200, True), (192, 192, 3, 81, True)]


def case(channels, out_channels, dilation, columns, bias, batch=2, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    weight = make(out_channels, channels, 7, scale=(channels * 7) ** -0.5)
    return dict(x=make(batch, channels, columns), weight=weight.permute(2, 0, 1).contiguous().permute(1, 2, 0),
                bias=make(out_channels) if bias else None, dilation=dilation)


def reference(c):
    return conv_kernels.conv_reference(c["x"], c["weight"], c["bias"], None, None, None, c["dilation"])


def test_cpu_operator_is_the_conv_of_the_channels_first_input():
    c = case(*CASES[0])
    got = torch.ops.voxserve.tma_conv(c["x"].transpose(1, 2).contiguous(), c["weight"], c["bias"], c["dilation"])
    torch.testing.assert_close(got, reference(c))


@pytest.mark.parametrize("channels, out_channels", [(24, 16), (8, 8), (16, 12)])
def test_the_kernel_refuses_channels_it_cannot_tile(channels, out_channels):
    assert not tma_conv.supports(channels, out_channels)
    x, w = torch.zeros(1, 40, channels), torch.zeros(out_channels, channels, 7)
    with pytest.raises(ValueError, match="does not fit"):
        tma_conv.tma_conv_triton(x, w, None, 1)


def test_triton_kernel_matches_the_tensor_code_in_the_interpreter():
    pytest.importorskip("triton")
    script = """
import torch
from tests.models.qwen3_tts.test_codec_tma_conv import CASES, case, reference
from vllm_voxserve.models.qwen3_tts.codec import tma_conv as tc
for shape in CASES:
    c = case(*shape)
    want = reference(c)
    x_tm = c["x"].transpose(1, 2).contiguous()
    for tile in (None, (32, 64, 16, 4, 3)):  # its own (or the default) tile, and one of several channel blocks
        if tile:
            tc.TILES[shape[0]] = tile
        torch.testing.assert_close(tc.tma_conv_triton(x_tm, c["weight"], c["bias"], c["dilation"]), want,
                                   atol=1e-4, rtol=1e-4)
print("ok")
"""
    interpret(script)


def test_a_decoder_on_the_kernel_streams_its_full_decode_in_the_interpreter():
    """The small decoder with its k7 convs on the kernels (`k7`, `tma`: the 48-channel ones on the TMA kernel, the
    others' channels no multiple of 16), decoding 2 + 4 frames from a state pool: the plain modules' full decode."""
    pytest.importorskip("triton")
    script = """
import copy
from tests.models.qwen3_tts.test_codec_conv_kernels import streamed_deviation
from tests.models.qwen3_tts.test_codec_streaming import SMALL_WINDOW_CONFIG
from vllm_voxserve.models.qwen3_tts.codec import tma_conv as tc
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import use_conv_kernels
called = []
def tma_path(x_tm, weight, bias, dilation):  # the operator's CPU dispatch pointed at the interpreted kernel
    called.append(x_tm.shape[-1])
    return tc.tma_conv_triton(x_tm, weight, bias, dilation)
tc.tma_conv.register_kernel("cpu")(tma_path)
decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
init_codec_decoder_weights(decoder, seed=3)
kernels = copy.deepcopy(decoder)
use_conv_kernels(kernels, "k7", tma=True)
deviation = streamed_deviation(decoder, kernels, chunks=((0, 2), (2, 6)), slots=(1,))
# a chunk: the three k7 convs of the 48-channel block on the TMA kernel
assert called == [48] * 6, called
assert deviation <= 1e-4, deviation
print("ok")
"""
    interpret(script)


def test_use_conv_kernels_puts_only_the_convs_it_can_tile_on_the_tma_kernel():
    decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
    init_codec_decoder_weights(decoder, seed=3)
    kernels = copy.deepcopy(decoder)
    use_conv_kernels(kernels, "dilated", tma=True)
    forms = {(u.conv1.conv.in_channels, u.conv1.conv.dilation[0]): u.conv1.kernel
             for u in kernels.modules() if isinstance(u, ResidualUnit)}
    assert forms == {(48, 3): "tma", (48, 9): "tma", (24, 3): "tiles", (24, 9): "tiles", (12, 3): "tiles",
                     (12, 9): "tiles", (6, 3): "tiles", (6, 9): "tiles", (48, 1): "", (24, 1): "", (12, 1): "",
                     (6, 1): ""}
    assert streamed_deviation(decoder, kernels) <= 1e-5  # on CPU the operators are the tensor code: the same audio


@pytest.mark.gpu
def test_gpu_kernel_matches_the_tensor_code_in_bf16():
    for shape in CASES + [(384, 384, 9, 4900, True), (768, 768, 1, 400, True)]:
        c = case(*shape, batch=8, dtype=torch.bfloat16, device="cuda")
        want = reference({k: v.float() if torch.is_tensor(v) else v for k, v in c.items()})
        got = tma_conv.tma_conv_triton(c["x"].transpose(1, 2).contiguous(), c["weight"], c["bias"], c["dilation"])
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
