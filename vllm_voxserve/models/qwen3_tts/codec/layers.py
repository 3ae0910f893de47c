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

from .tma_conv import supports as tma_supports
from .tma_conv import tma_conv

State = dict[str, torch.Tensor]

# How a `CausalConv1d` computes (`serve_conv_forms` chooses once per served decoder; a new module is CONV):
CONV = "conv"  # torch's conv1d (cuDNN on GPU)
GEMM = "gemm"  # one matmul over the unfolded windows (`conv_as_gemm`)
TMA = "tma"  # the TMA conv kernel over time-major input (`tma_conv`; torch's conv1d on CPU)
ONE_CHANNEL = "one_channel"  # a weighted sum over windows, compiled (`one_channel_conv`); torch's conv1d eagerly
# The fewest channels of a dilated conv that runs as a matmul: the vocoder's 768-channel dilated convs, which cuDNN
# runs without tensor cores on the H200 (a matmul was 1.4x faster for the codec at 16 chunks); narrower dilated convs
# stay within 1.7x of undilated ones there.
WIDE_DILATED_CHANNELS = 512


class CausalConv1d(nn.Module):
    """Official `Qwen3TTSTokenizerV2CausalConvNet` at stride 1: left pad (k-1)*d, no right pad."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history_len = (kernel_size - 1) * dilation
        self.state_name = ""
        self.form = CONV  # see serve_conv_forms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv(F.pad(x, (self.history_len, 0)))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if self.history_len == 0:
            return self._conv(x)
        extended = torch.cat([state[self.state_name], x], dim=-1)
        state[self.state_name] = extended[..., -self.history_len:]
        return self._conv(extended)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        if self.form == TMA:  # time-major input: inductor writes it so in the pass that makes x
            return tma_conv(x.transpose(1, 2).contiguous(), conv.weight, conv.bias, conv.dilation[0])
        if self.form == GEMM:
            return conv_as_gemm(x, conv.weight, conv.bias, conv.dilation[0])
        if self.form == ONE_CHANNEL and torch.compiler.is_compiling():
            return one_channel_conv(x, conv.weight, conv.bias, conv.dilation[0])
        return conv(x)


def serve_conv_forms(module: nn.Module) -> None:
    """Choose each causal conv's form under `module` (a decoder, on its device), once, before it is compiled or
    served:
    - the residual units' dilated convs of at least WIDE_DILATED_CHANNELS channels: GEMM;
    - the residual units' other k7 convs: TMA where the kernel takes their channels (every one at the served size) and
      the device has TMA (a GPU before Hopper keeps CONV; on CPU the operator is torch's conv, so CPU runs check
      this path), their weight stored tap-major (same values; the kernel reads one tap's [out, in] block at a time);
      with cuDNN's convs they spent most of a 64-chunk batch in layout conversions on the H200;
    - a conv to one channel (the last): ONE_CHANNEL, too few output channels for cuDNN's tensor-core kernels;
    - every other conv: CONV."""
    tma_device = has_tma(next(module.parameters()).device)
    for unit in module.modules():
        if isinstance(unit, ResidualUnit):
            conv = unit.conv1.conv
            if conv.dilation[0] > 1 and conv.groups == 1 and conv.in_channels >= WIDE_DILATED_CHANNELS:
                unit.conv1.form = GEMM
            elif tma_device and conv.groups == 1 and tma_supports(conv.in_channels, conv.out_channels):
                tap_major = conv.weight.detach().permute(2, 0, 1).contiguous().permute(1, 2, 0)
                conv.weight = nn.Parameter(tap_major, requires_grad=False)
                unit.conv1.form = TMA
    for conv in module.modules():
        if isinstance(conv, CausalConv1d) and conv.conv.out_channels == 1 and conv.conv.groups == 1:
            conv.form = ONE_CHANNEL


def has_tma(device: torch.device) -> bool:
    """Whether the TMA conv kernel runs on `device`: a GPU of compute capability 9.0 (Hopper) or later, or any other
    device, where the operator is torch's conv."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


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
    weight [O, C, K] -> [B, O, T], where cuBLAS takes the tensor cores."""
    windows = _windows(x, weight.shape[-1], dilation)
    columns = windows.permute(0, 2, 1, 3).reshape(x.shape[0], windows.shape[2], -1)  # [B, T, C*K]
    return F.linear(columns, weight.reshape(weight.shape[0], -1), bias).transpose(1, 2)


def _windows(x: torch.Tensor, taps: int, dilation: int) -> torch.Tensor:
    """The conv's input windows as a view: x [B, C, T + (taps-1)*dilation] -> [B, C, T, taps]."""
    return x.unfold(-1, (taps - 1) * dilation + 1, 1)[..., ::dilation]


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta over [B, C, T]: alpha, beta per channel, log scale, official op order."""
    a, b = torch.exp(alpha[None, :, None]), torch.exp(beta[None, :, None])
    return x + (1.0 / (b + 1e-9)) * torch.pow(torch.sin(x * a), 2)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.right_trim] if self.right_trim else y

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if self.history_len == 0:
            return self.forward(x)
        extended = torch.cat([state[self.state_name], x], dim=-1)
        state[self.state_name] = extended[..., -self.history_len:]
        start = self.history_len * self.stride
        return self.conv(extended)[..., start : start + x.shape[-1] * self.stride]


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

    def _tail(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
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
