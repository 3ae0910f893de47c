"""The residual units' conv operator: its tensor code against the unfused modules, its Triton kernel against the
tensor code (interpreted on CPU, compiled on GPU), and a decoder on it streaming the full decode."""

import copy

import pytest
import torch

from tests.models.qwen3_tts.test_codec_streaming import SMALL_WINDOW_CONFIG
from tests.models.qwen3_tts.test_cp_kernels import interpret
from vllm_voxserve.models.qwen3_tts.codec import conv_kernels
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import ResidualUnit, use_conv_kernels, use_gemm
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, decode_chunk

# (channels, out channels, taps, dilation, input columns, snake, residual, bias): the served residual units' shapes
# (96-768 channels, k7 at dilations 1/3/9, k1 with SnakeBeta and residual), the last conv's one channel, and sizes
# that are no multiple of a tile (masks)
CASES = [(96, 96, 7, 9, 130, False, False, True), (96, 96, 1, 1, 70, True, True, True),
         (40, 17, 3, 2, 33, True, False, False), (64, 1, 7, 1, 30, False, False, True),
         (192, 192, 7, 3, 81, False, False, True)]


def case(channels, out_channels, taps, dilation, columns, snake, residual, bias, batch=2, dtype=torch.float32,
         device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    out_len = columns - (taps - 1) * dilation
    return dict(x=make(batch, channels, columns), weight=make(out_channels, channels, taps,
                                                              scale=(channels * taps) ** -0.5),
                bias=make(out_channels) if bias else None, snake_alpha=make(channels, scale=0.3) if snake else None,
                snake_beta=make(channels, scale=0.3) if snake else None,
                residual=make(batch, out_channels, out_len) if residual else None, dilation=dilation)


def test_the_operator_is_the_unfused_residual_tail():
    """SnakeBeta -> conv k1 -> + input, as ResidualUnit computes it without the operator."""
    torch.manual_seed(0)
    unit = ResidualUnit(12, dilation=3).eval()
    with torch.no_grad():
        for p in unit.parameters():
            p.normal_(0, 0.3)
        x, h = torch.randn(2, 12, 20), torch.randn(2, 12, 20)
        want = unit.conv2(unit.act2(h)) + x
        got = torch.ops.voxserve.codec_conv(h, unit.conv2.conv.weight, unit.conv2.conv.bias, unit.act2.alpha,
                                            unit.act2.beta, x, 1)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(conv_kernels.snake(h, unit.act2.alpha, unit.act2.beta), unit.act2(h))
    with pytest.raises(ValueError, match="does not fit"):
        conv_kernels.conv_triton(x, unit.conv1.conv.weight, None, None, None, None, 9)  # 20 columns, 55 needed


def test_triton_kernel_matches_the_tensor_code_in_the_interpreter():
    pytest.importorskip("triton")
    script = """
import torch
from tests.models.qwen3_tts.test_codec_conv_kernels import CASES, case
from vllm_voxserve.models.qwen3_tts.codec import conv_kernels as ck
for shape in CASES:
    c = case(*shape)
    want = ck.conv_reference(**c)
    # the default tile, and the flat loop (a block of rows spanning two taps at 64)
    for tile in (None, (32, 64, 64, 4, 3, True)):
        if tile:
            ck.TILES[shape[0], shape[1], shape[2]] = tile
        torch.testing.assert_close(ck.conv_triton(**c), want, atol=1e-4, rtol=1e-4)
    # any strides: the weight tap-major (as use_conv_kernels stores it), the input time-major
    c["weight"] = c["weight"].permute(2, 0, 1).contiguous().permute(1, 2, 0)
    c["x"] = c["x"].transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(ck.conv_triton(**c), want, atol=1e-4, rtol=1e-4)
print("ok")
"""
    interpret(script)


def test_a_decoder_on_the_kernel_streams_its_full_decode_in_the_interpreter():
    """The small decoder with its residual units on the Triton kernel (interpreted; the operator's CPU dispatch
    pointed at it), decoding 2 + 4 frames from a state pool: the full decode of the plain modules."""
    pytest.importorskip("triton")
    script = """
import copy
from tests.models.qwen3_tts.test_codec_conv_kernels import streamed_deviation
from tests.models.qwen3_tts.test_codec_streaming import SMALL_WINDOW_CONFIG
from vllm_voxserve.models.qwen3_tts.codec import conv_kernels as ck
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import use_conv_kernels
called = []
def triton_path(*args):
    called.append(1)
    return ck.conv_triton(*args)
ck.conv_reference = triton_path
decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
init_codec_decoder_weights(decoder, seed=3)
kernels = copy.deepcopy(decoder)
use_conv_kernels(kernels)
deviation = streamed_deviation(decoder, kernels, chunks=((0, 2), (2, 6)), slots=(1,))
# a chunk: 2 calls a residual unit, 1 for the last conv
assert len(called) == 2 * (2 * 3 * len(SMALL_WINDOW_CONFIG.upsample_rates) + 1), len(called)
assert deviation <= 1e-4, deviation
print("ok")
"""
    interpret(script)


@pytest.mark.parametrize("mode", ["tails", "dilated", "k7", "all"])
def test_use_conv_kernels_marks_the_residual_units_convs_and_streams_on_cpu(mode):
    """On CPU the operator is the tensor code: the same decoder on it decodes as the plain one. "dilated" leaves the
    convs that are already matmuls (the first block's here) and the undilated ones to their forms, "k7" only the
    matmuls."""
    torch.manual_seed(0)
    decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
    init_codec_decoder_weights(decoder, seed=3)
    kernels = copy.deepcopy(decoder)
    use_gemm(kernels.wide_dilated_convs(min_channels=48))  # the first block's two (48 channels)
    use_conv_kernels(kernels, mode)
    units = [m for m in kernels.modules() if isinstance(m, ResidualUnit)]
    assert len(units) == 3 * len(SMALL_WINDOW_CONFIG.upsample_rates)
    on_kernel = [(u.conv1.conv.in_channels, u.conv1.conv.dilation[0]) for u in units if u.conv1.kernel]
    if mode == "tails":
        assert not on_kernel
    elif mode == "dilated":
        assert on_kernel == [(c, d) for c in (24, 12, 6) for d in (3, 9)]
    elif mode == "k7":
        assert on_kernel == [(48, 1)] + [(c, d) for c in (24, 12, 6) for d in (1, 3, 9)]
    else:
        assert len(on_kernel) == len(units)
    with_tails = mode in ("tails", "all")
    assert all(u.fused_tail == with_tails and not u.conv2.kernel for u in units)
    assert bool(kernels.decoder[-1].kernel) == with_tails  # the last conv, with the tails
    assert not kernels.decoder[0].kernel
    assert streamed_deviation(decoder, kernels) <= 1e-5


def streamed_deviation(decoder: CodecDecoder, changed: CodecDecoder, chunks=((0, 4), (4, 9)),
                       slots=(2, 0)) -> float:
    """Largest sample difference between `decoder`'s full decode of one request per slot and `changed` streaming
    them in `chunks` (frame ranges) from those state pool slots, on CPU."""
    codes = torch.randint(0, 2048, (len(slots), chunks[-1][1], 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = decoder(codes.transpose(1, 2))[:, 0]
        pool = CodecStatePool(changed.config, num_slots=max(slots) + 1, dtype=torch.float32, device="cpu")
        rows = torch.tensor(slots)
        pool.reset(rows)
        wav = torch.cat([decode_chunk(changed, codes[:, a:b], rows, pool) for a, b in chunks], dim=1)
    return (wav - full).abs().max().item()


@pytest.mark.gpu
def test_gpu_kernel_matches_the_tensor_code_in_bf16():
    for shape in CASES + [(768, 768, 7, 9, 120, False, False, True), (384, 384, 1, 1, 800, True, True, True)]:
        c = case(*shape, batch=8, dtype=torch.bfloat16, device="cuda")
        want = conv_kernels.conv_reference(**{k: v.float() if torch.is_tensor(v) else v for k, v in c.items()})
        key = shape[:3]
        for tile in (None, (64, 128, 64, 4, 3, True)):  # its own (or the default) tile, and the flat loop
            served = conv_kernels.TILES.get(key)
            if tile:
                conv_kernels.TILES[key] = tile
            try:
                got = conv_kernels.conv_triton(**c)
            finally:
                conv_kernels.TILES.pop(key, None)
                if served:
                    conv_kernels.TILES[key] = served
            torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "tma"), [("all", False), ("k7", True)])
def test_gpu_compiled_decoder_on_the_kernel_matches_the_plain_one(mode, tma):
    """The served decoder shape, bf16, compiled program with the kernels (every k7 conv on the TMA kernel: the served
    form) against the plain modules in fp32."""
    from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
    from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram

    decoder = CodecDecoder(CodecDecoderConfig()).eval()
    init_codec_decoder_weights(decoder, seed=0)
    codes = torch.randint(0, 2048, (4, 15, 16), generator=torch.Generator().manual_seed(2)).cuda()
    reference = copy.deepcopy(decoder).cuda()
    program = Qwen3CodecProgram(decoder.to("cuda", torch.bfloat16), torch.bfloat16, compile=True, conv_kernels=mode,
                                conv_tma=tma)
    with torch.no_grad():
        full = reference(codes.transpose(1, 2))[:, 0]
        pool = program.make_state_pool(8, torch.device("cuda"))
        slots = torch.tensor([5, 1, 2, 7], device="cuda")
        pool.reset(slots)
        wav = torch.cat([program.decode(codes[:, a:b], slots, pool) for a, b in ((0, 5), (5, 15))], dim=1)
    error = (wav - full).pow(2).mean().sqrt() / full.pow(2).mean().sqrt()
    assert error.item() < 0.05, error.item()  # bf16 against fp32 (the plain bf16 program is about as far)


@torch.inference_mode()
@pytest.mark.parametrize(("mode", "tma"), [("all", False), ("k7", True)])
def test_compiled_program_on_the_operator_decodes_as_the_plain_one(mode, tma):
    """The operators inside torch.compile (CPU inductor: their tensor code as one opaque call each), as a program with
    `conv_kernels="all"` (or the k7 convs on the TMA kernel, their input made time-major) compiles them: the plain
    eager program's audio."""
    from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram

    decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
    init_codec_decoder_weights(decoder, seed=3)
    plain = Qwen3CodecProgram(decoder)
    torch._dynamo.reset()
    kernels = Qwen3CodecProgram(copy.deepcopy(decoder), compile=True, conv_kernels=mode, conv_tma=tma)
    with pytest.raises(ValueError, match="conv_kernels must be one of"):
        Qwen3CodecProgram(copy.deepcopy(decoder), conv_kernels="on")
    pools = [p.make_state_pool(3, torch.device("cpu")) for p in (plain, kernels)]
    codes = torch.randint(0, 2048, (2, 7, 16), generator=torch.Generator().manual_seed(4))
    for a, b in ((0, 3), (3, 7)):
        want, got = (p.decode(codes[:, a:b], torch.tensor([0, 2]), pool) for p, pool in zip((plain, kernels), pools))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
