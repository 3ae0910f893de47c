"""The vocoder's residual-unit convs as one Triton kernel on GPU (plain tensor code on CPU).

`codec_conv(x, weight, bias, snake_alpha, snake_beta, residual, dilation)`: a conv1d without padding over
channels-first input, `x [B, C, L]`, `weight [O, C, K]` -> `[B, O, L - (K-1)*dilation]`, optionally with a SnakeBeta
applied to its input as it is read (`snake_alpha`/`snake_beta` per input channel, log scale, as `layers.SnakeBeta`)
and a residual added to its output. A residual unit's second half (SnakeBeta -> conv k1 -> + input) is one call.

Why: on the H200 the served decoder spends most of a 64-chunk batch outside the arithmetic (3.2 ms of tensor-core work
in 33.9 ms; results/h200/2026-12-02_session13): cuDNN's NCHW<->NHWC conversions around each conv, a conv kernel
without tensor cores for one dilated conv (7.35 ms), and element-wise passes over the full-rate activations. This
kernel reads the channels-first activations as they are (a [C, T] tile is what the tensor cores' right operand wants),
so no layout conversion, and folds the SnakeBeta and the residual add into the conv's loads and its store. A
torch.library custom op, so torch.compile and CUDA graphs see one opaque call.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

try:  # the GPU path; CPU-only installs run the reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta over [B, C, T] (`layers.SnakeBeta`'s forward): alpha, beta per channel, log scale, official op order."""
    a, b = torch.exp(alpha[None, :, None]), torch.exp(beta[None, :, None])
    return x + (1.0 / (b + 1e-9)) * torch.pow(torch.sin(x * a), 2)


def conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, snake_alpha: torch.Tensor | None,
                   snake_beta: torch.Tensor | None, residual: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """Tensor code of the operator: the unfused modules' computation."""
    if snake_alpha is not None:
        x = snake(x, snake_alpha, snake_beta)
    y = F.conv1d(x, weight, bias, dilation=dilation)
    return y if residual is None else y + residual


@torch.library.custom_op("voxserve::codec_conv", mutates_args=())
def codec_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, snake_alpha: torch.Tensor | None,
               snake_beta: torch.Tensor | None, residual: torch.Tensor | None, dilation: int) -> torch.Tensor:
    if x.is_cuda and triton is not None:
        return conv_triton(x, weight, bias, snake_alpha, snake_beta, residual, dilation)
    return conv_reference(x, weight, bias, snake_alpha, snake_beta, residual, dilation)


@codec_conv.register_fake
def _(x, weight, bias, snake_alpha, snake_beta, residual, dilation):
    return x.new_empty(x.shape[0], weight.shape[0], _out_len(x, weight, dilation))


def _out_len(x: torch.Tensor, weight: torch.Tensor, dilation: int) -> int:
    return x.shape[-1] - (weight.shape[-1] - 1) * dilation


# (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages[, flat]) by (in channels, out channels, taps); flat: one loop
# over (tap, channel) rows of BLOCK_C, a block may span two taps (else channel blocks outer, taps inner). The least
# time over 64 chunks of 10 frames (and 4 of 5 for the tails) of the tiles on the H200 (benchmarks/codec_conv_tiles.py;
# k7: results/h200/2026-12-02_session14/codec/run1_tiles.json, k1: session 13's); `tile` below for other shapes.
TILES: dict[tuple[int, int, int], tuple] = {
    (768, 768, 7): (128, 128, 64, 8, 3, True), (384, 384, 7): (128, 128, 32, 8, 3), (192, 192, 7): (64, 128, 32, 4, 3),
    (96, 96, 7): (128, 128, 64, 8, 3, True), (768, 768, 1): (128, 64, 32, 4, 3), (384, 384, 1): (128, 128, 32, 8, 3),
    (192, 192, 1): (128, 128, 32, 8, 3), (96, 96, 1): (128, 128, 32, 8, 3),
    (96, 1, 7): (16, 256, 32, 4, 3),  # the last conv: not timed
}


def tile(channels: int, out_channels: int, taps: int) -> tuple:
    """(BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages, flat) for a conv of this shape."""
    if (channels, out_channels, taps) in TILES:
        return (*TILES[channels, out_channels, taps], False)[:6]
    block_o = min(128, max(16, triton.next_power_of_2(out_channels)))
    return block_o, 64, 32, 4, 3, False


def conv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, snake_alpha: torch.Tensor | None,
                snake_beta: torch.Tensor | None, residual: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """The operator as one Triton kernel (also runs under TRITON_INTERPRET=1 on CPU tensors, for tests)."""
    batch, channels, _ = x.shape
    out_channels, taps = weight.shape[0], weight.shape[2]
    length = _out_len(x, weight, dilation)
    if weight.shape[1] != channels or length < 1:
        raise ValueError(f"codec_conv: x {tuple(x.shape)} does not fit weight {tuple(weight.shape)} at dilation "
                         f"{dilation}")
    y = torch.empty((batch, out_channels, length), dtype=x.dtype, device=x.device)
    block_o, block_t, block_c, warps, stages, flat = tile(channels, out_channels, taps)
    res = residual if residual is not None else y  # a placeholder pointer where HAS_RES is off
    grid = (triton.cdiv(length, block_t), triton.cdiv(out_channels, block_o), batch)
    _conv_kernel[grid](
        x, weight, bias if bias is not None else y, snake_alpha if snake_alpha is not None else y,
        snake_beta if snake_beta is not None else y, res, y,
        channels, out_channels, length, dilation,
        *x.stride(), *weight.stride(), *res.stride(), *y.stride(),
        TAPS=taps, HAS_BIAS=bias is not None, SNAKE=snake_alpha is not None,
        HAS_RES=residual is not None, EXACT=x.dtype == torch.float32, FLAT=flat,
        BLOCK_O=block_o, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=warps, num_stages=stages,
    )
    return y


if triton is not None:

    @triton.jit
    def _snake(xs, alpha_ptr, beta_ptr, c, c_ok):
        """SnakeBeta on a loaded [rows, columns] tile whose rows are channels `c` (snake(0) = 0: masked stay zero)."""
        alpha = tl.exp(tl.load(alpha_ptr + c, mask=c_ok, other=0.0).to(tl.float32))
        inv_beta = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=c_ok, other=0.0).to(tl.float32)) + 1e-9)
        xf = xs.to(tl.float32)
        s = tl.sin(xf * alpha[:, None])
        return (xf + inv_beta[:, None] * (s * s)).to(xs.dtype)

    @triton.jit
    def _dot(w, xs, acc, EXACT: tl.constexpr):
        if EXACT:
            return tl.dot(w, xs, acc, input_precision="ieee")
        return tl.dot(w, xs, acc)

    @triton.jit
    def _conv_kernel(x_ptr, w_ptr, bias_ptr, alpha_ptr, beta_ptr, res_ptr, y_ptr,
                     channels, out_channels, length, dilation,
                     sxb, sxc, sxt, swo, swc, swk, srb, sro, srt, syb, syo, syt,
                     TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr,
                     HAS_RES: tl.constexpr, EXACT: tl.constexpr, FLAT: tl.constexpr,
                     BLOCK_O: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        # one program: BLOCK_O output channels x BLOCK_T output columns of one row; the K taps are K shifted reads of
        # the input tile (the later ones hit the cache), each one [BLOCK_O, BLOCK_C] x [BLOCK_C, BLOCK_T] product
        row = tl.program_id(2).to(tl.int64)
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        t_ok, o_ok = t < length, o < out_channels
        acc = tl.zeros((BLOCK_O, BLOCK_T), dtype=tl.float32)
        x_row = x_ptr + row * sxb
        if FLAT:  # rows r = tap * channels + channel, BLOCK_C at a time: one loop for the pipeliner
            for r0 in range(0, TAPS * channels, BLOCK_C):
                r = r0 + tl.arange(0, BLOCK_C)
                k = r // channels
                c = r - k * channels
                r_ok = r < TAPS * channels
                xs = tl.load(x_row + c[:, None] * sxc + (t[None, :] + k[:, None] * dilation) * sxt,
                             mask=r_ok[:, None] & t_ok[None, :], other=0.0)
                if SNAKE:
                    xs = _snake(xs, alpha_ptr, beta_ptr, c, r_ok)
                w = tl.load(w_ptr + o[:, None] * swo + c[None, :] * swc + k[None, :] * swk,
                            mask=o_ok[:, None] & r_ok[None, :], other=0.0)
                acc = _dot(w, xs, acc, EXACT)
        else:
            for c0 in range(0, channels, BLOCK_C):
                c = c0 + tl.arange(0, BLOCK_C)
                c_ok = c < channels
                for k in tl.static_range(TAPS):
                    xs = tl.load(x_row + c[:, None] * sxc + (t[None, :] + k * dilation) * sxt,
                                 mask=c_ok[:, None] & t_ok[None, :], other=0.0)
                    if SNAKE:
                        xs = _snake(xs, alpha_ptr, beta_ptr, c, c_ok)
                    w = tl.load(w_ptr + o[:, None] * swo + c[None, :] * swc + k * swk,
                                mask=o_ok[:, None] & c_ok[None, :], other=0.0)
                    acc = _dot(w, xs, acc, EXACT)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + o, mask=o_ok, other=0.0).to(tl.float32)[:, None]
        out_ok = o_ok[:, None] & t_ok[None, :]
        if HAS_RES:
            acc += tl.load(res_ptr + row * srb + o[:, None] * sro + t[None, :] * srt, mask=out_ok,
                           other=0.0).to(tl.float32)
        tl.store(y_ptr + row * syb + o[:, None] * syo + t[None, :] * syt, acc.to(y_ptr.dtype.element_ty),
                 mask=out_ok)
