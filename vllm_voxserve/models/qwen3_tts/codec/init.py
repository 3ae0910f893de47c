"""Random weights for the codec that make audible, unclipped output (the official default init decodes to exact
silence: zero codebooks, zero SnakeBeta parameters, LayerScale 0.01, ConvNeXt gamma 1e-6)."""
from __future__ import annotations

import math

import torch
from torch import nn

from .decoder import CodecDecoder
from .layers import ResidualUnit

TARGET_RMS = 0.15  # output level after calibration: clearly not silence, rarely clipped
RESIDUAL_BRANCH_GAIN = 0.3


def _fan_in(module: nn.Module, weight: torch.Tensor) -> float:
    if isinstance(module, nn.ConvTranspose1d):  # each output sums in_channels * k / stride inputs
        return weight.shape[0] * weight.shape[2] / module.stride[0]
    return weight[0].numel()


@torch.no_grad()
def randomize_module_(module: nn.Module, generator: torch.Generator) -> None:
    """Variance-preserving random weights for every parameter (by its role), in place."""

    def uniform_(p: torch.Tensor, low: float, high: float) -> None:
        p.copy_(torch.rand(p.shape, generator=generator, dtype=torch.float64).mul(high - low).add(low))

    def normal_(p: torch.Tensor, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).mul(std))

    for mod_name, mod in module.named_modules():
        for name, p in mod.named_parameters(recurse=False):
            if name == "cluster_usage":
                uniform_(p, 0.5, 2.0)
            elif name == "embedding_sum":
                normal_(p, 1.0)
            elif name in ("alpha", "beta"):  # SnakeBeta, log scale
                uniform_(p, -0.3, 0.3)
            elif name in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma
                uniform_(p, 0.05, 0.2)
            elif p.dim() >= 2:
                normal_(p, 1.0 / math.sqrt(_fan_in(mod, p)))
            elif name == "weight":  # norms
                uniform_(p, 0.8, 1.2)
            else:  # biases
                uniform_(p, -0.05, 0.05)


@torch.no_grad()
def init_codec_decoder_weights(decoder: CodecDecoder, seed: int, calibration_frames: int = 4) -> None:
    """Randomize `decoder` in place, then scale its last conv so random codes decode at about TARGET_RMS."""
    generator = torch.Generator().manual_seed(seed)
    randomize_module_(decoder, generator)
    for module in decoder.modules():
        if isinstance(module, ResidualUnit):  # keep the 12 stacked residual branches from growing the signal ~3x/block
            module.conv2.conv.weight.mul_(RESIDUAL_BRANCH_GAIN)
    codes = torch.randint(0, decoder.config.codebook_size, (2, decoder.config.num_quantizers, calibration_frames),
                          generator=generator)
    last_conv = decoder.decoder[-1].conv
    param = next(decoder.parameters())
    captured = []
    handle = last_conv.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        decoder(codes.to(param.device))
    finally:
        handle.remove()
    rms = captured[0].float().pow(2).mean().sqrt().item()
    factor = TARGET_RMS / max(rms, 1e-12)
    last_conv.weight.mul_(factor)
    last_conv.bias.mul_(factor)


@torch.no_grad()
def init_codec_encoder_weights(encoder: nn.Module, seed: int) -> None:
    """Randomize a `CodecEncoder` in place; its codebooks are buffers (Mimi), filled with N(0, 1) entries."""
    generator = torch.Generator().manual_seed(seed)
    randomize_module_(encoder, generator)
    for name, buf in encoder.named_buffers():
        if name.endswith("embed_sum"):
            buf.copy_(torch.randn(buf.shape, generator=generator, dtype=torch.float64))
        elif name.endswith("cluster_usage"):
            buf.copy_(torch.rand(buf.shape, generator=generator, dtype=torch.float64).mul(1.5).add(0.5))


@torch.no_grad()
def init_speaker_encoder_weights(module: nn.Module, seed: int) -> None:
    """Randomize a `SpeakerEncoder` in place (the talker-side checkpoint maker calls this for Base models)."""
    randomize_module_(module, torch.Generator().manual_seed(seed))
