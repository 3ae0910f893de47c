"""The vocoder's k7 convs on the tensor-memory accelerator: input time-major, every tap's tile one aligned TMA copy.

`tma_conv(x_tm, weight, bias, dilation)`: x_tm `[B, T_in, C]` (time-major: the channels of a column contiguous),
weight `[O, C, K]` stored tap-major (`layers.serve_conv_forms`) -> `[B, O, T_in - (K-1)*dilation]`, channels-first.

Why: cuDNN runs the codec's convs channels-last, with layout conversions around each call that took most of a
64-chunk batch on the H200, and a conv kernel reading channels-first input has rows that start at any element and
taps that shift by `k * dilation` columns, so none of its loads is 16-byte aligned (no vector loads, no asynchronous
copies). Time-major, a tap's shift moves whole rows of C channels (C a multiple of 8), so every tile is a TMA copy at
an aligned address and the reduction over (tap, channel) blocks pipelines like a matmul's. The decoder makes its
input time-major in the element-wise pass that already writes it (SnakeBeta and the history concat), so the layout
costs no pass of its own. Hopper or later; C a multiple of 16, O of 8.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

try:  # the GPU path; CPU-only installs run torch's conv1d
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    triton = None


@torch.library.custom_op("voxserve::tma_conv", mutates_args=())
def tma_conv(x_tm: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    if x_tm.is_cuda and triton is not None:
        return tma_conv_triton(x_tm, weight, bias, dilation)
    return F.conv1d(x_tm.transpose(1, 2), weight, bias, dilation=dilation)


@tma_conv.register_fake
def _(x_tm, weight, bias, dilation):
    return x_tm.new_empty(x_tm.shape[0], weight.shape[0], x_tm.shape[1] - (weight.shape[-1] - 1) * dilation)


# (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages) by channels; BLOCK_C divides the channels. The least time over
# 64 chunks of 10 frames and 4 of 5 on the H200 (benchmarks/codec_conv_tiles.py); `tile` below for other channel counts.
TILES: dict[int, tuple[int, int, int, int, int]] = {96: (128, 128, 32, 4, 5), 192: (128, 256, 64, 8, 3),
                                                    384: (128, 128, 64, 8, 3), 768: (128, 128, 64, 8, 3)}


SHARED_MEMORY_BYTES = 232448  # the most one block may take on Hopper (227 KiB)


def tile(channels: int, element_size: int = 2) -> tuple[int, int, int, int, int]:
    """The tile for `channels` input channels of `element_size`-byte elements. The table's tiles are bf16's; a
    float32 codec (`voxserve.codec_dtype`) doubles every stage's weight and input tiles, and Triton keeps one buffer
    more than the stages, so stages (down to two), then columns, give way until the pipeline fits."""
    block_c = 64 if channels % 64 == 0 else 32 if channels % 32 == 0 else 16
    block_o, block_t, block_c, warps, stages = TILES.get(channels, (128, 64, block_c, 4, 3))
    while pipeline_bytes(block_o, block_t, block_c, stages, element_size) > SHARED_MEMORY_BYTES and block_t > 16:
        if stages > 2:
            stages -= 1
        else:
            block_t //= 2
    return block_o, block_t, block_c, warps, stages


def pipeline_bytes(block_o: int, block_t: int, block_c: int, stages: int, element_size: int) -> int:
    """Shared memory of the kernel's pipeline: a weight and an input tile per buffer, one buffer more than stages."""
    return (stages + 1) * (block_o + block_t) * block_c * element_size


def supports(channels: int, out_channels: int) -> bool:
    """Whether the kernel takes a conv of these channels: blocks of at least 16 input channels (the tensor cores'
    least reduction), 16-byte rows of output channels for TMA."""
    return channels % 16 == 0 and out_channels % 8 == 0


def tma_conv_triton(x_tm: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    dilation: int) -> torch.Tensor:
    """The operator as one Triton kernel (runs under TRITON_INTERPRET=1 on CPU tensors too, for tests)."""
    batch, columns, channels = x_tm.shape
    out_channels, taps = weight.shape[0], weight.shape[2]
    length = columns - (taps - 1) * dilation
    if weight.shape[1] != channels or length < 1 or not supports(channels, out_channels):
        raise ValueError(f"tma_conv: x {tuple(x_tm.shape)} (time-major) does not fit weight {tuple(weight.shape)} "
                         f"at dilation {dilation}")
    x_tm = x_tm.contiguous()
    # [K*O, C]: row k*O + o is tap k of output channel o (the tap-major storage; a copy only if it is not)
    w_rows = weight.permute(2, 0, 1).reshape(taps * out_channels, channels)
    y = torch.empty((batch, out_channels, length), dtype=x_tm.dtype, device=x_tm.device)
    block_o, block_t, block_c, warps, stages = tile(channels, x_tm.element_size())
    x_desc = TensorDescriptor.from_tensor(x_tm, [1, block_t, block_c])
    w_desc = TensorDescriptor.from_tensor(w_rows, [block_o, block_c])
    grid = (triton.cdiv(length, block_t), triton.cdiv(out_channels, block_o), batch)
    _tma_conv_kernel[grid](x_desc, w_desc, bias if bias is not None else y, y, channels, out_channels, length,
                           dilation, *y.stride(), TAPS=taps, HAS_BIAS=bias is not None,
                           EXACT=x_tm.dtype == torch.float32, BLOCK_O=block_o, BLOCK_T=block_t, BLOCK_C=block_c,
                           num_warps=warps, num_stages=stages)
    return y


if triton is not None:

    @triton.jit
    def _tma_conv_kernel(x_desc, w_desc, bias_ptr, y_ptr, channels, out_channels, length, dilation, syb, syo, syt,
                         TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, EXACT: tl.constexpr,
                         BLOCK_O: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        # one program: BLOCK_O output channels x BLOCK_T output columns of one row, reduced over (tap, channel
        # block). Rows past the input or the weight read as zeros (TMA); a weight block past O reads the next tap's
        # rows, whose products land in output channels the store masks off.
        row = tl.program_id(2)
        t0 = tl.program_id(0) * BLOCK_T
        o0 = tl.program_id(1) * BLOCK_O
        c_blocks = channels // BLOCK_C
        acc = tl.zeros((BLOCK_O, BLOCK_T), dtype=tl.float32)
        for r in range(0, TAPS * c_blocks):
            k = r // c_blocks
            c0 = (r - k * c_blocks) * BLOCK_C
            w = w_desc.load([k * out_channels + o0, c0])
            xs = x_desc.load([row, t0 + k * dilation, c0]).reshape(BLOCK_T, BLOCK_C)
            if EXACT:
                acc = tl.dot(w, tl.trans(xs), acc, input_precision="ieee")
            else:
                acc = tl.dot(w, tl.trans(xs), acc)
        o = o0 + tl.arange(0, BLOCK_O)
        t = t0 + tl.arange(0, BLOCK_T)
        o_ok = o < out_channels
        if HAS_BIAS:
            acc += tl.load(bias_ptr + o, mask=o_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + row.to(tl.int64) * syb + o[:, None] * syo + t[None, :] * syt, acc.to(y_ptr.dtype.element_ty),
                 mask=o_ok[:, None] & (t < length)[None, :])
