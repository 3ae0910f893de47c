"""Convolutional building blocks of the 12 Hz codec decoder, with the official parameter names.

Every module has two paths:
- `forward(x)`: the whole sequence at once, causal left zero-padding (the official computation);
- `stream(x, state)`: the next columns of the sequence. Each stateful conv keeps the last `history_len` columns of its
  own input under `state[self.state_name]` (`[B, C_in, history_len]`) and replaces that entry with the new history.
  A zero history is exactly the zero padding of the full path, so a reset state starts a sequence.
`state_name`s are set by the decoder (module paths) so the state pool can name its tensors."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .conv_kernels import codec_conv, snake
from .tma_conv import supports as tma_supports
from .tma_conv import tma_conv

State = dict[str, torch.Tensor]


class CausalConv1d(nn.Module):
    """Official `Qwen3TTSTokenizerV2CausalConvNet` at stride 1: left pad (k-1)*d, no right pad."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history_len = (kernel_size - 1) * dilation
        self.state_name = ""
        self.channels_last = False  # see use_channels_last
        self.as_gemm = False  # see use_gemm
        self.kernel = ""  # "tiles" or "tma": see use_conv_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv(F.pad(x, (self.history_len, 0)))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if self.history_len == 0:
            return self._conv(x)
        extended = torch.cat([state[self.state_name], x], dim=-1)
        state[self.state_name] = extended[..., -self.history_len:]
        return self._conv(extended)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        # The last conv (to the waveform) has one output channel, too few for cuDNN's tensor-core kernels; compiled,
        # it is one reduction kernel instead. (Session 4's served trace's implicit_convolve_sgemm was taken for it;
        # session 7's profile showed those were the wide dilated convs, which `use_gemm` turns into matmuls.)
        if self.kernel == "tma":  # time-major input: inductor writes it so in the pass that makes x
            return tma_conv(x.transpose(1, 2).contiguous(), self.conv.weight, self.conv.bias, self.conv.dilation[0])
        if self.kernel:
            return codec_conv(x, self.conv.weight, self.conv.bias, None, None, None, self.conv.dilation[0])
        if self.conv.out_channels == 1 and self.conv.groups == 1 and torch.compiler.is_compiling():
            return one_channel_conv(x, self.conv.weight, self.conv.bias, self.conv.dilation[0])
        if self.as_gemm:
            return conv_as_gemm(x, self.conv.weight, self.conv.bias, self.conv.dilation[0])
        return conv_channels_last(self.conv, x) if self.channels_last else self.conv(x)


def one_channel_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """conv1d to one output channel without padding, as a weighted sum over (channel, tap) windows in float32:
    x [B, C, T + (K-1)*dilation], weight [1, C, K] -> [B, 1, T]. Inductor fuses it into one reduction kernel; eager
    it materializes the K windows, so the modules call it only when compiled."""
    windows = _windows(x, weight.shape[-1], dilation)
    y = (windows.float() * weight[0, :, None, :].float()).sum(dim=(1, 3), keepdim=True).squeeze(-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def conv_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """conv1d (one group) without padding as one matmul over the unfolded windows: x [B, C, T + (K-1)*dilation],
    weight [O, C, K] -> [B, O, T]. For convs over few columns and many channels (the decoder's convs at the frame
    rate), where the windows cost little to unfold and the matmul takes the tensor cores by cuBLAS's choice."""
    windows = _windows(x, weight.shape[-1], dilation)
    columns = windows.permute(0, 2, 1, 3).reshape(x.shape[0], windows.shape[2], -1)  # [B, T, C*K]
    return F.linear(columns, weight.reshape(weight.shape[0], -1), bias).transpose(1, 2)


def _windows(x: torch.Tensor, taps: int, dilation: int) -> torch.Tensor:
    """The conv's input windows as a view: x [B, C, T + (taps-1)*dilation] -> [B, C, T, taps]."""
    return x.unfold(-1, (taps - 1) * dilation + 1, 1)[..., ::dilation]


def transposed_conv_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            stride: int) -> torch.Tensor:
    """conv_transpose1d (one group, kernel a multiple m of the stride) as one matmul and an overlap-add of m shifted
    copies: x [B, C, T], weight [C, O, m*stride] -> [B, O, (T-1)*stride + m*stride], as `F.conv_transpose1d`.
    Input column t writes outputs t*stride ... t*stride + k - 1: tap block i of column t lands in output block t + i."""
    batch, _, frames = x.shape
    channels_out, taps = weight.shape[1], weight.shape[2]
    blocks = taps // stride
    z = F.linear(x.transpose(1, 2), weight.reshape(weight.shape[0], -1).t())  # [B, T, O*k]
    z = z.reshape(batch, frames, channels_out, blocks, stride)
    y = sum(F.pad(z[:, :, :, i], (0, 0, 0, 0, i, blocks - 1 - i)) for i in range(blocks))  # [B, T+m-1, O, s]
    y = y.permute(0, 2, 1, 3).reshape(batch, channels_out, (frames + blocks - 1) * stride)
    return y if bias is None else y + bias[:, None]


def use_gemm(convs: list[nn.Module]) -> None:
    """Run these convs (`CausalConv1d`, or `CausalTransposedConv1d` with a kernel a multiple of its stride) as
    matmuls (`conv_as_gemm`, `transposed_conv_as_gemm`); their parameters stay as loaded."""
    for conv_module in convs:
        name = conv_module.state_name or "conv"
        if conv_module.conv.groups != 1:
            raise ValueError(f"{name}: a grouped conv does not run as one matmul")
        if isinstance(conv_module, CausalTransposedConv1d) and conv_module.conv.kernel_size[0] % conv_module.stride:
            raise ValueError(f"{name}: its kernel is not a multiple of its stride")
        conv_module.as_gemm = True


KERNEL_MODES = ("tails", "dilated", "k7", "all")


def use_conv_kernels(module: nn.Module, mode: str = "all", tma: bool = False) -> None:
    """Run the residual units under `module` on `conv_kernels.codec_conv` instead of cuDNN's convs (with layout
    conversions around them) and element-wise passes: "tails" their SnakeBeta -> conv k1 -> + input as one kernel,
    "dilated" their convs at dilation > 1 not already matmuls (`use_gemm`), "k7" every k7 conv not already a matmul,
    "all" the tails and every k7 conv. Takes precedence over `use_gemm` and `use_channels_last` for those convs. A
    conv's weight is stored tap-major (same values): the kernel reads one tap's [out, in] block at a time. With the
    tails on the kernel, the last conv (to one channel) is too: compiled after a tail kernel, inductor unfolded its
    windows into a 7 ms pass (session 13).
    `tma`: the k7 convs on `tma_conv.tma_conv` (time-major input, aligned TMA tiles) where their channels allow."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"conv kernel mode must be one of {KERNEL_MODES}, got {mode!r}")
    for conv in module.modules():
        if mode in ("tails", "all") and isinstance(conv, CausalConv1d) and conv.conv.out_channels == 1:
            conv.kernel = "tiles"
    for unit in module.modules():
        if isinstance(unit, ResidualUnit):
            unit.fused_tail = mode in ("tails", "all")
            conv = unit.conv1
            if mode == "all" or (mode == "k7" and not conv.as_gemm) or (
                    mode == "dilated" and conv.conv.dilation[0] > 1 and not conv.as_gemm):
                tap_major = conv.conv.weight.detach().permute(2, 0, 1).contiguous().permute(1, 2, 0)
                conv.conv.weight = nn.Parameter(tap_major, requires_grad=False)
                conv.kernel = "tma" if tma and tma_supports(conv.conv.in_channels, conv.conv.out_channels) else "tiles"


def use_channels_last(module: nn.Module) -> None:
    """Run every causal conv under `module` (but one to a single channel) as a 2-D conv over [B, C, 1, T] with its
    weight stored channels-last (same values). cuDNN's tensor-core kernels work channels-last: with the weight so, a
    conv's output is channels-last too and the next conv takes it without the layout conversions cuDNN otherwise
    runs around each call (12-19 % of the codec lanes' device time in session 4's served H200 trace)."""
    for conv_module in module.modules():
        if isinstance(conv_module, (CausalConv1d, CausalTransposedConv1d)) and conv_module.conv.out_channels > 1:
            weight = conv_module.conv.weight.detach()
            nhwc = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last).squeeze(2)
            conv_module.conv.weight = nn.Parameter(nhwc, requires_grad=False)
            conv_module.channels_last = True


def conv_channels_last(conv: nn.Conv1d | nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """`conv(x)` as a 2-D conv over [B, C, 1, T] (its weight made channels-last by `use_channels_last`)."""
    weight = conv.weight.unsqueeze(2)
    if isinstance(conv, nn.ConvTranspose1d):
        y = F.conv_transpose2d(x.unsqueeze(2), weight, conv.bias, stride=(1, conv.stride[0]), groups=conv.groups)
    else:
        y = F.conv2d(x.unsqueeze(2), weight, conv.bias, dilation=(1, conv.dilation[0]), groups=conv.groups)
    return y.squeeze(2)


class CausalTransposedConv1d(nn.Module):
    """Official `Qwen3TTSTokenizerV2CausalTransConvNet`: ConvTranspose1d(k, s) with k-s samples cut on the right, so
    T inputs give T*s outputs. Streaming keeps the last ceil(k/s)-1 input columns (whose kernels still reach into the
    new outputs) and recomputes their overlap, instead of storing an output tail."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        if kernel_size < stride:
            raise ValueError(f"kernel_size {kernel_size} < stride {stride} would leave gaps")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.right_trim = kernel_size - stride
        self.history_len = -(-kernel_size // stride) - 1
        self.state_name = ""
        self.channels_last = False  # see use_channels_last
        self.as_gemm = False  # see use_gemm

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        if self.as_gemm:
            return transposed_conv_as_gemm(x, self.conv.weight, self.conv.bias, self.stride)
        return conv_channels_last(self.conv, x) if self.channels_last else self.conv(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._conv(x)
        return y[..., : y.shape[-1] - self.right_trim] if self.right_trim else y

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if self.history_len == 0:
            return self.forward(x)
        extended = torch.cat([state[self.state_name], x], dim=-1)
        state[self.state_name] = extended[..., -self.history_len:]
        start = self.history_len * self.stride
        return self._conv(extended)[..., start : start + x.shape[-1] * self.stride]


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta)+1e-9) * sin^2(exp(alpha) * x), alpha/beta per channel in log scale (official op order)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha, self.beta)

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return self.forward(x)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm -> Linear x4 -> GELU -> Linear -> *gamma -> residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def _pointwise(self, residual: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return residual + (self.gamma * h).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise(x, self.dwconv(x))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return self._pointwise(x, self.dwconv.stream(x, state))


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k7 (dilation d) -> SnakeBeta -> conv k1 -> + input."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)
        self.fused_tail = False  # see use_conv_kernels

    def _tail(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.fused_tail:
            conv = self.conv2.conv
            return codec_conv(h, conv.weight, conv.bias, self.act2.alpha, self.act2.beta, x, 1)
        return self.conv2(self.act2(h)) + x  # conv2 has no history: its stream is its forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._tail(x, self.conv1(self.act1(x)))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return self._tail(x, self.conv1.stream(self.act1(x), state))


class DecoderBlock(nn.Module):
    """SnakeBeta -> CausalTransposedConv(C -> C/2, k=2r, s=r) -> residual units with dilations 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(in_dim), CausalTransposedConv1d(in_dim, out_dim, 2 * rate, rate)]
        units += [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.block:
            x = unit(x)
        return x

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        for unit in self.block:
            x = unit.stream(x, state)
        return x


class UpsampleStage(nn.ModuleList):
    """[CausalTransposedConv(k=s=factor), ConvNeXtBlock], as the official `upsample.{i}` ModuleList."""

    def __init__(self, dim: int, factor: int):
        super().__init__([CausalTransposedConv1d(dim, dim, factor, factor), ConvNeXtBlock(dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self:
            x = m(x)
        return x

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        for m in self:
            x = m.stream(x, state)
        return x
