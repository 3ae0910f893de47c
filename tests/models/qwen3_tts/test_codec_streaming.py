"""Exact incremental decode: any chunk schedule, and batches of requests at different positions, give the samples of
one full decode (tiny codec, fp32, CPU)."""
import copy
import itertools

import pytest
import torch

from vllm_voxserve.models.qwen3_tts.codec.checkpoint import TINY_DECODER_CONFIG
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_decoder_weights
from vllm_voxserve.models.qwen3_tts.codec.layers import GEMM, CausalConv1d, conv_as_gemm, one_channel_conv
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, codec_state_shapes, decode_chunk

SPF = 1920
TOL = 1e-5
# Most tests use an 8-frame attention window so that short sequences (fast on CPU) cross it many times and chunks
# are wider than it; test_real_window_* keeps the real 72-frame window.
SMALL_WINDOW_CONFIG = CodecDecoderConfig(
    **{**TINY_DECODER_CONFIG.to_dict(), "sliding_window": 8, "num_hidden_layers": 3}
)
NUM_FRAMES = 30


@pytest.fixture(scope="module")
def decoder() -> CodecDecoder:
    torch.set_num_threads(2)
    dec = CodecDecoder(SMALL_WINDOW_CONFIG).eval()
    init_codec_decoder_weights(dec, seed=3)
    return dec


@pytest.fixture(scope="module")
def requests(decoder):
    """Three requests' codes `[T, 16]` of different lengths and their full decodes `[T * 1920]`."""
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (t, 16), generator=g) for t in (NUM_FRAMES, 17, 31)]
    with torch.no_grad():
        full = [decoder(c.T[None])[0, 0] for c in codes]
    return codes, full


def _chunks(schedule, total):
    """Chunk sizes from a schedule (its last size repeats) until `total` frames are covered."""
    sizes, start = [], 0
    for size in itertools.chain(schedule, itertools.repeat(schedule[-1])):
        if start >= total:
            return sizes
        sizes.append(min(size, total - start))
        start += sizes[-1]


def test_full_decode_is_audible_and_mostly_unclipped(requests):
    _, full = requests
    wav = full[0]
    assert wav.shape == (NUM_FRAMES * SPF,)
    rms = wav.pow(2).mean().sqrt().item()
    assert 0.05 < rms < 0.5, rms
    assert (wav.abs() >= 1).float().mean().item() < 0.01


@pytest.mark.parametrize("schedule", [[1, 2, 4, 8, 16], [3], [10], [25, 5]])
def test_any_chunk_schedule_equals_full_decode(decoder, requests, schedule):
    codes, full = requests[0][0], requests[1][0]
    pool = CodecStatePool(decoder.config, num_slots=3, dtype=torch.float32, device="cpu")
    slots = torch.tensor([1])
    pool.reset(slots)
    pieces, start = [], 0
    with torch.no_grad():
        for size in _chunks(schedule, NUM_FRAMES):
            wav = decode_chunk(decoder, codes[None, start : start + size], slots, pool)
            assert wav.shape == (1, size * SPF)
            pieces.append(wav[0])
            start += size
    streamed = torch.cat(pieces)
    assert (streamed - full).abs().max().item() <= TOL
    assert pool.positions(slots).tolist() == [NUM_FRAMES]


def test_batch_mixes_requests_at_different_positions(decoder, requests):
    """A runs alone, B joins later, C joins later still (batch rows in a changing order); each equals its full
    decode. Every call decodes the same F for all rows, as a captured (B, F) bucket would."""
    codes, full = requests
    pool = CodecStatePool(decoder.config, num_slots=5, dtype=torch.float32, device="cpu")
    slot_of = {0: 4, 1: 0, 2: 2}
    done = {r: 0 for r in slot_of}
    out = {r: [] for r in slot_of}
    plan = [([0], 5), ([0], 2), ([1, 0], 4), ([0, 1], 3), ([2, 1, 0], 4), ([1, 2, 0], 3), ([2, 0, 1], 3)]
    for rows, size in plan:
        fresh = [r for r in rows if done[r] == 0]
        if fresh:
            pool.reset(torch.tensor([slot_of[r] for r in fresh]))
        batch_codes = torch.stack([codes[r][done[r] : done[r] + size] for r in rows])
        slots = torch.tensor([slot_of[r] for r in rows])
        with torch.no_grad():
            wav = decode_chunk(decoder, batch_codes, slots, pool)
        for i, r in enumerate(rows):
            out[r].append(wav[i])
            done[r] += size
    # Finish each request alone with one chunk.
    for r in slot_of:
        if done[r] == len(codes[r]):
            continue
        with torch.no_grad():
            wav = decode_chunk(decoder, codes[r][None, done[r] :], torch.tensor([slot_of[r]]), pool)
        out[r].append(wav[0])
    for r in slot_of:
        streamed = torch.cat(out[r])
        assert streamed.shape == full[r].shape
        assert (streamed - full[r]).abs().max().item() <= TOL, r


def test_reset_slot_starts_a_new_request(decoder, requests):
    codes, full = requests
    pool = CodecStatePool(decoder.config, num_slots=1, dtype=torch.float32, device="cpu")
    slot = torch.tensor([0])
    with torch.no_grad():
        pool.reset(slot)
        decode_chunk(decoder, codes[1][None, :12], slot, pool)  # leave state behind
        pool.reset(slot)
        wav = torch.cat([decode_chunk(decoder, codes[2][None, s : s + 9], slot, pool)[0] for s in range(0, 31, 9)])
    assert (wav - full[2]).abs().max().item() <= TOL


def test_real_window_chunked_decode_equals_full_decode():
    dec = CodecDecoder(TINY_DECODER_CONFIG).eval()
    init_codec_decoder_weights(dec, seed=5)
    assert dec.config.sliding_window == 72
    codes = torch.randint(0, 2048, (1, 80, 16), generator=torch.Generator().manual_seed(1))
    pool = CodecStatePool(dec.config, num_slots=2, dtype=torch.float32, device="cpu")
    slot = torch.tensor([1])
    pool.reset(slot)
    with torch.no_grad():
        full = dec(codes.transpose(1, 2))[0, 0]
        bounds = [0, 1, 3, 7, 15, 31, 63, 80]
        parts = [decode_chunk(dec, codes[:, s:e], slot, pool)[0] for s, e in zip(bounds, bounds[1:])]
    assert (torch.cat(parts) - full).abs().max().item() <= TOL


def test_state_layout_of_the_full_codec():
    shapes = codec_state_shapes(CodecDecoderConfig())
    kv = [s for name, s in shapes.items() if name.startswith("pre_transformer.")]
    assert len(kv) == 16 and all(s == (16, 71, 64) for s in kv)
    assert sum(torch.Size(s).numel() for s in kv) == 1_163_264  # notes §4.3
    assert shapes["pre_conv"] == (512, 2)
    assert shapes["decoder.0"] == (1024, 6)
    assert shapes["decoder.4.block.4.conv1"] == (96, 54)
    assert shapes["decoder.1.block.1"] == (1536, 1)  # trans-conv k=16, s=8: one input column reaches ahead
    assert "upsample.0.0" not in shapes  # k = s = 2: nothing carries over


def test_decode_chunk_rejects_bad_shapes(decoder):
    pool = CodecStatePool(decoder.config, num_slots=2, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError):
        decode_chunk(decoder, torch.zeros(2, 3, 16, dtype=torch.long), torch.tensor([0]), pool)
    with pytest.raises(ValueError):
        decode_chunk(decoder, torch.zeros(1, 3, 8, dtype=torch.long), torch.tensor([0]), pool)
    with pytest.raises(ValueError):
        decode_chunk(decoder, torch.zeros(1, 0, 16, dtype=torch.long), torch.tensor([0]), pool)
    bf16_pool = CodecStatePool(decoder.config, num_slots=1, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="bfloat16"):
        decode_chunk(decoder, torch.zeros(1, 2, 16, dtype=torch.long), torch.tensor([0]), bf16_pool)
    with pytest.raises(ValueError):
        CodecStatePool(decoder.config, num_slots=0, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("dilation", [1, 3])
def test_one_channel_conv_equals_conv1d(dilation):
    """The compiled decoder's form of its last conv (see layers.CausalConv1d._conv), eagerly, against conv1d."""
    g = torch.Generator().manual_seed(dilation)
    x, weight, bias = torch.randn(3, 8, 40, generator=g), torch.randn(1, 8, 7, generator=g), torch.randn(1, generator=g)
    want = torch.nn.functional.conv1d(x, weight, bias, dilation=dilation)
    torch.testing.assert_close(one_channel_conv(x, weight, bias, dilation), want, atol=1e-5, rtol=0)
    bf16 = one_channel_conv(x.bfloat16(), weight.bfloat16(), None, dilation)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == want.shape


@pytest.mark.parametrize("dilation", [1, 3])
def test_conv_as_gemm_equals_conv1d(dilation):
    """The wide dilated convs' matmul form (layers.conv_as_gemm), plain and over a channels-last input."""
    g = torch.Generator().manual_seed(20 + dilation)
    x, weight, bias = torch.randn(3, 8, 40, generator=g), torch.randn(5, 8, 7, generator=g), torch.randn(5, generator=g)
    want = torch.nn.functional.conv1d(x, weight, bias, dilation=dilation)
    torch.testing.assert_close(conv_as_gemm(x, weight, bias, dilation), want, atol=1e-5, rtol=0)
    channels_last = x.unsqueeze(2).contiguous(memory_format=torch.channels_last).squeeze(2)
    torch.testing.assert_close(conv_as_gemm(channels_last, weight, None, dilation), want - bias[:, None],
                               atol=1e-5, rtol=0)


def test_dilated_convs_as_matmuls_stream_the_full_decode(decoder, requests):
    gemm = copy.deepcopy(decoder)
    dilated = [m for m in gemm.modules() if isinstance(m, CausalConv1d) and m.conv.dilation[0] > 1]
    assert len(dilated) == 2 * len(gemm.config.upsample_rates)  # dilations 3 and 9 in each block
    for conv in dilated:  # every dilated conv of this small decoder (the served size: the 768-channel ones)
        conv.form = GEMM
    codes, full = requests[0][0], requests[1][0]
    pool = CodecStatePool(gemm.config, num_slots=2, dtype=torch.float32, device="cpu")
    slots = torch.tensor([0])
    pool.reset(slots)
    with torch.no_grad():
        wav = torch.cat([decode_chunk(gemm, codes[None, a:b], slots, pool)[0] for a, b in ((0, 7), (7, 17), (17, 30))])
    assert (wav - full).abs().max().item() <= TOL


@pytest.mark.gpu
def test_decode_chunk_replays_in_a_cuda_graph(decoder, requests):
    """Capture one (B=2, F=3) call, replay it with other slots and codes: same samples as eager calls."""
    codes, full = requests
    dec = CodecDecoder(decoder.config).cuda().eval()
    dec.load_state_dict(decoder.state_dict())
    pool = CodecStatePool(dec.config, num_slots=4, dtype=torch.float32, device="cuda")
    static_codes = torch.zeros(2, 3, 16, dtype=torch.long, device="cuda")
    static_slots = torch.tensor([0, 1], device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (scratch slots 0, 1)
                decode_chunk(dec, static_codes, static_slots, pool)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_wav = decode_chunk(dec, static_codes, static_slots, pool)
        pool.reset(torch.tensor([2, 3], device="cuda"))
        out = {0: [], 1: []}
        for step in range(10):
            static_codes.copy_(torch.stack([codes[0][3 * step : 3 * step + 3], codes[2][3 * step : 3 * step + 3]]))
            static_slots.copy_(torch.tensor([2, 3]) if step % 2 == 0 else torch.tensor([3, 2]))
            if step % 2:
                static_codes.copy_(static_codes.flip(0))
            graph.replay()
            wav = static_wav.cpu()
            out[0].append(wav[0] if step % 2 == 0 else wav[1])
            out[1].append(wav[1] if step % 2 == 0 else wav[0])
    n = 30 * SPF
    assert (torch.cat(out[0]) - full[0][:n]).abs().max().item() <= 1e-4
    assert (torch.cat(out[1]) - full[2][:n]).abs().max().item() <= 1e-4
