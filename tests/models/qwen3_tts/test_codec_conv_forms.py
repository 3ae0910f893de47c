"""The codec's served conv forms (layers.serve_conv_forms): which conv gets which form, the k7 convs' TMA kernel
(time-major input) against torch's conv1d in the Triton interpreter on CPU and compiled on GPU, and a decoder in the
served forms streaming the plain decoder's full decode (eager and compiled on CPU; bf16, compiled, on GPU)."""

import copy

import pytest
import torch
from torch.nn import functional as F

from tests.models.qwen3_tts.test_codec_streaming import SMALL_WINDOW_CONFIG
from tests.models.qwen3_tts.test_cp_kernels import interpret
from vllm_voxserve.models.qwen3_tts.codec import tma_conv
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import (CONV, GEMM, ONE_CHANNEL, TMA, CausalConv1d, ResidualUnit,
                                                         serve_conv_forms)
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, decode_chunk
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram

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
    return F.conv1d(c["x"], c["weight"], c["bias"], dilation=c["dilation"])


def small_decoder() -> CodecDecoder:
    decoder = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
    init_codec_decoder_weights(decoder, seed=3)
    return decoder


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


def test_the_served_size_puts_every_k7_conv_on_a_matmul_or_the_tma_kernel():
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig())
    serve_conv_forms(decoder)
    units = [u.conv1 for u in decoder.modules() if isinstance(u, ResidualUnit)]
    assert [(c.conv.in_channels, c.conv.dilation[0]) for c in units if c.form == GEMM] == [(768, 3), (768, 9)]
    assert all(c.form == TMA for c in units if c.form != GEMM) and len(units) == 12
    assert decoder.decoder[-1].form == ONE_CHANNEL
    others = [m for m in decoder.modules()
              if isinstance(m, CausalConv1d) and m not in units and m.conv.out_channels > 1]
    assert others and all(m.form == CONV for m in others)


def test_a_gpu_before_hopper_keeps_torchs_conv_for_the_k7_convs(monkeypatch):
    from vllm_voxserve.models.qwen3_tts.codec import layers

    assert layers.has_tma(torch.device("cpu")) and layers.has_tma(torch.device("meta"))
    monkeypatch.setattr(layers, "has_tma", lambda device: False)
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig())
    serve_conv_forms(decoder)
    forms = [u.conv1.form for u in decoder.modules() if isinstance(u, ResidualUnit)]
    assert forms.count(GEMM) == 2 and forms.count(CONV) == 10


def test_small_channels_stay_on_torchs_conv_and_stream_the_full_decode():
    """The small decoder: the 48-channel block's k7 convs on the TMA kernel, the narrower ones (channels no multiple of
    16) on torch's conv; on CPU the operator is torch's conv: the plain decoder's full decode."""
    decoder = small_decoder()
    served = copy.deepcopy(decoder)
    serve_conv_forms(served)
    forms = {(u.conv1.conv.in_channels, u.conv1.conv.dilation[0]): u.conv1.form
             for u in served.modules() if isinstance(u, ResidualUnit)}
    assert forms == {(c, d): TMA if c == 48 else CONV for c in (48, 24, 12, 6) for d in (1, 3, 9)}
    assert streamed_deviation(decoder, served) <= 1e-5


def test_triton_kernel_matches_torch_in_the_interpreter():
    pytest.importorskip("triton")
    script = """
import torch
from tests.models.qwen3_tts.test_codec_conv_forms import CASES, case, reference
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


def test_a_served_decoder_on_the_kernel_streams_its_full_decode_in_the_interpreter():
    """The small decoder in its served forms (the 48-channel k7 convs on the TMA kernel), decoding 2 + 4 frames from a
    state pool: the plain modules' full decode."""
    pytest.importorskip("triton")
    script = """
import copy
from tests.models.qwen3_tts.test_codec_conv_forms import small_decoder, streamed_deviation
from vllm_voxserve.models.qwen3_tts.codec import tma_conv as tc
from vllm_voxserve.models.qwen3_tts.codec.layers import serve_conv_forms
called = []
def tma_path(x_tm, weight, bias, dilation):  # the operator's CPU dispatch pointed at the interpreted kernel
    called.append(x_tm.shape[-1])
    return tc.tma_conv_triton(x_tm, weight, bias, dilation)
tc.tma_conv.register_kernel("cpu")(tma_path)
decoder = small_decoder()
served = copy.deepcopy(decoder)
serve_conv_forms(served)
deviation = streamed_deviation(decoder, served, chunks=((0, 2), (2, 6)), slots=(1,))
# a chunk: the three k7 convs of the 48-channel block on the TMA kernel
assert called == [48] * 6, called
assert deviation <= 1e-4, deviation
print("ok")
"""
    interpret(script)


@torch.inference_mode()
def test_the_compiled_program_decodes_as_the_plain_eager_one():
    """The served forms inside torch.compile (CPU inductor: the TMA operator as one opaque call, the last conv as a
    weighted sum), a graph per chunk length: the plain eager program's audio."""
    decoder = small_decoder()
    plain = Qwen3CodecProgram(decoder)
    torch._dynamo.reset()
    compiled = Qwen3CodecProgram(copy.deepcopy(decoder), compile=True)
    pools = [p.make_state_pool(3, torch.device("cpu")) for p in (plain, compiled)]
    codes = torch.randint(0, 2048, (2, 7, 16), generator=torch.Generator().manual_seed(4))
    for a, b in ((0, 3), (3, 7)):
        want, got = (p.decode(codes[:, a:b], torch.tensor([0, 2]), pool) for p, pool in zip((plain, compiled), pools))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.gpu
def test_gpu_kernel_matches_torch_in_bf16():
    for shape in CASES + [(384, 384, 9, 4900, True), (768, 768, 1, 400, True)]:
        c = case(*shape, batch=8, dtype=torch.bfloat16, device="cuda")
        want = reference({k: v.float() if torch.is_tensor(v) else v for k, v in c.items()})
        got = tma_conv.tma_conv_triton(c["x"].transpose(1, 2).contiguous(), c["weight"], c["bias"], c["dilation"])
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_gpu_served_program_matches_the_plain_torch_decoder():
    """The served codec on the GPU (real decoder shape, bf16, compiled, the served conv forms: wide dilated convs as
    matmuls, the other k7 convs on the TMA kernel) streaming two chunks, against the plain torch modules' full decode
    in fp32. Needs torch (and triton) only."""
    decoder = CodecDecoder(CodecDecoderConfig()).eval()
    init_codec_decoder_weights(decoder, seed=0)
    codes = torch.randint(0, 2048, (4, 15, 16), generator=torch.Generator().manual_seed(2)).cuda()
    reference_decoder = copy.deepcopy(decoder).cuda()
    program = Qwen3CodecProgram(decoder.to("cuda", torch.bfloat16), torch.bfloat16, compile=True)
    assert {u.conv1.form for u in program.decoder.modules() if isinstance(u, ResidualUnit)} == {GEMM, TMA}
    with torch.no_grad():
        full = reference_decoder(codes.transpose(1, 2))[:, 0]
        pool = program.make_state_pool(8, torch.device("cuda"))
        slots = torch.tensor([5, 1, 2, 7], device="cuda")
        pool.reset(slots)
        wav = torch.cat([program.decode(codes[:, a:b], slots, pool) for a, b in ((0, 5), (5, 15))], dim=1)
    error = (wav - full).pow(2).mean().sqrt() / full.pow(2).mean().sqrt()
    assert error.item() < 0.05, error.item()  # bf16 against fp32 (the plain bf16 program is about as far)


@pytest.mark.parametrize("channels", [*tma_conv.TILES, 32, 48, 64, 1024])
@pytest.mark.parametrize("element_size", [2, 4])
def test_every_tile_fits_the_shared_memory_of_a_block(channels, element_size):
    block_o, block_t, block_c, _, stages = tma_conv.tile(channels, element_size)
    assert channels % block_c == 0 and stages >= 2
    assert tma_conv.pipeline_bytes(block_o, block_t, block_c, stages, element_size) <= tma_conv.SHARED_MEMORY_BYTES
    if element_size == 2 and channels in tma_conv.TILES:  # the measured bf16 tiles are served as chosen
        assert tma_conv.tile(channels) == tma_conv.TILES[channels]


def test_the_float32_codec_takes_a_smaller_tile_where_bf16s_would_not_fit():
    # the H200 refused the 768-channel bf16 tile in float32: Triton asked for 262,160 bytes of the 232,448 a block
    # may take, which is this estimate (plus 16)
    assert tma_conv.pipeline_bytes(*tma_conv.TILES[768][:3], tma_conv.TILES[768][4], 4) == 262144
    assert tma_conv.tile(768, 4) != tma_conv.TILES[768]
