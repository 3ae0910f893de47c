"""The Qwen3-TTS 12 Hz codec decoder (codes `[B, 16, T]` -> wav `[B, 1, 1920*T]` at 24 kHz), with the official
parameter names (the `decoder.*` part of `speech_tokenizer/model.safetensors`).

Dataflow: split-RVQ dequantize -> causal pre_conv k3 -> pre_transformer (sliding window) -> 2 x (trans-conv x2 +
ConvNeXt) -> vocoder (conv k7, 4 DecoderBlocks with rates 8,5,4,3, SnakeBeta, conv k7) -> clamp(-1, 1).
Everything is causal, so `stream` decodes the next frames exactly, from a state dict (see state.py)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .configuration import CodecDecoderConfig
from .layers import CausalConv1d, CausalTransposedConv1d, DecoderBlock, SnakeBeta, State, UpsampleStage
from .transformer import PreTransformer

POSITION = "position"  # state entry: frames decoded so far, `[B]` long


class EuclideanCodebook(nn.Module):
    def __init__(self, dim: int, codebook_size: int, epsilon: float = 1e-5):
        super().__init__()
        self.epsilon = epsilon
        # Parameters (not buffers) in the official decoder, so they are in its state dict under these names.
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=self.epsilon)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, dim: int, codebook_size: int):
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size)


class ResidualVectorQuantization(nn.Module):
    def __init__(self, num_quantizers: int, dim: int, codebook_size: int):
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantization(dim, codebook_size) for _ in range(num_quantizers))


class ResidualVectorQuantizer(nn.Module):
    """Sum of codebook lookups, then a 1x1 conv to the output width. `input_proj` only serves encoding; it is kept
    so the parameter set matches the checkpoint."""

    def __init__(self, num_quantizers: int, dim: int, io_dim: int, codebook_size: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = ResidualVectorQuantization(num_quantizers, dim, codebook_size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes `[B, K, T]` -> `[B, io_dim, T]`, summed in the official order (quantizer 0 first)."""
        quantized = None
        for k, layer in enumerate(self.vq.layers):
            q = F.embedding(codes[:, k], layer._codebook.table())  # [B, T, dim]
            quantized = q if quantized is None else quantized + q
        # The 1x1 conv as a matmul over the lookups' [B, T, dim] layout: torch 2.11's CPU bf16 conv1d miscomputed it
        # at exactly 5 frames (42 % off; the matmul is not).
        return F.linear(quantized, self.output_proj.weight[:, :, 0]).transpose(1, 2)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        dim, io_dim = config.codebook_dim // 2, config.codebook_dim
        self.n_q_semantic = config.num_semantic_quantizers
        self.rvq_first = ResidualVectorQuantizer(self.n_q_semantic, dim, io_dim, config.codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(
            config.num_quantizers - self.n_q_semantic, dim, io_dim, config.codebook_size
        )

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        n = self.n_q_semantic
        return self.rvq_first.decode(codes[:, :n]) + self.rvq_rest.decode(codes[:, n:])


class CodecDecoder(nn.Module):
    """Official `Qwen3TTSTokenizerV2Decoder`, same module tree and parameter names."""

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.pre_transformer = PreTransformer(config)
        self.quantizer = SplitResidualVectorQuantizer(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.upsample = nn.ModuleList(UpsampleStage(config.latent_dim, r) for r in config.upsampling_ratios)
        vocoder: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, 7)]
        for i, rate in enumerate(config.upsample_rates):
            vocoder.append(DecoderBlock(config.decoder_dim // 2**i, config.decoder_dim // 2 ** (i + 1), rate))
        out_dim = config.decoder_dim // 2 ** len(config.upsample_rates)
        vocoder += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(vocoder)
        self._name_conv_states()

    def _name_conv_states(self) -> None:
        for name, module in self.named_modules():
            if isinstance(module, (CausalConv1d, CausalTransposedConv1d)):
                module.state_name = name

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-request streaming state: entry name -> shape without the batch dim (see state.py)."""
        shapes: dict[str, tuple[int, ...]] = {POSITION: ()}
        for i in range(self.config.num_hidden_layers):
            for name in self.pre_transformer.cache_names(i):
                shapes[name] = self.pre_transformer.cache_shape()
        for module in self.modules():
            if isinstance(module, (CausalConv1d, CausalTransposedConv1d)) and module.history_len > 0:
                shapes[module.state_name] = (module.conv.in_channels, module.history_len)
        return shapes

    def _check_codes(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"expected codes [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Full decode: codes `[B, 16, T]` long -> wav `[B, 1, T * samples_per_frame]`."""
        self._check_codes(codes)
        hidden = self.pre_conv(self.quantizer.decode(codes))
        hidden = self.pre_transformer(hidden.transpose(1, 2)).transpose(1, 2)
        for stage in self.upsample:
            hidden = stage(hidden)
        for module in self.decoder:
            hidden = module(hidden)
        return hidden.clamp(min=-1, max=1)

    def stream(self, codes: torch.Tensor, state: State) -> torch.Tensor:
        """Decode the next F frames of each row: codes `[B, 16, F]` -> wav `[B, 1, F * samples_per_frame]`.
        `state` maps every `state_shapes()` name to a `[B, ...]` tensor; entries are replaced by the new state."""
        self._check_codes(codes)
        start = state[POSITION]
        hidden = self.pre_conv.stream(self.quantizer.decode(codes), state)
        hidden = self.pre_transformer.stream(hidden.transpose(1, 2), start, state).transpose(1, 2)
        for stage in self.upsample:
            hidden = stage.stream(hidden, state)
        for module in self.decoder:
            hidden = module.stream(hidden, state)
        state[POSITION] = start + codes.shape[-1]
        return hidden.clamp(min=-1, max=1)
