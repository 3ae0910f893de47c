"""The codec encoder (Mimi, encode path only; the `encoder.*` part of `speech_tokenizer/model.safetensors`): turns a
24 kHz reference clip into codes `[F, 16]` for Base voice cloning, as official `Qwen3TTSTokenizerV2Model.encode`.

SEANet conv encoder (25 Hz) -> causal transformer (full causal attention: the official call builds a plain causal
mask, so Mimi's sliding_window is not applied) -> stride-2 downsample (12.5 Hz) -> split RVQ, nearest codeword by
Euclidean distance. The acoustic RVQ quantizes the same embeddings as the semantic one (not its residual)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .transformer import Attention, LayerScale, rope_cos_sin, sliding_window_mask


@dataclass(frozen=True)
class MimiEncoderConfig:
    """The fields of a transformers MimiConfig that the encode path reads (defaults are MimiConfig's)."""

    sampling_rate: int = 24000
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0  # 0: hidden_size // num_attention_heads, as MimiConfig
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    frame_rate: float = 0.0  # 0: sampling_rate / frame_size, as MimiConfig

    def __post_init__(self):
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if not self.frame_rate:
            object.__setattr__(self, "frame_rate", self.sampling_rate / (math.prod(self.upsampling_ratios) * 2))
        if not self.use_causal_conv or self.use_conv_shortcut or self.audio_channels != 1:
            raise ValueError("only the causal, mono, no-conv-shortcut Mimi encoder of Qwen3-TTS is supported")
        if self.hidden_act != "gelu" or self.pad_mode != "constant":
            raise ValueError("the Qwen3-TTS Mimi encoder uses hidden_act 'gelu' and pad_mode 'constant'")
        if self.num_semantic_quantizers != 1:
            raise ValueError("num_semantic_quantizers must be 1")

    @property
    def encodec_frame_rate(self) -> int:
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))

    @classmethod
    def from_dict(cls, d: dict) -> "MimiEncoderConfig":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known and v is not None})


class MimiConv1d(nn.Module):
    """Causal conv: left pad k_eff - stride, right pad up to a whole number of strides, both in `pad_mode`."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.effective_kernel = (kernel - 1) * dilation + 1
        self.padding_total = self.effective_kernel - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        n_frames = math.ceil((length - self.effective_kernel + self.padding_total) / self.stride + 1) - 1
        extra = n_frames * self.stride + self.effective_kernel - self.padding_total - length
        return self.conv(F.pad(x, (self.padding_total, extra), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int):
        super().__init__()
        self.block = nn.ModuleList([nn.ELU(), MimiConv1d(dim, hidden, kernel, dilation=dilation), nn.ELU(),
                                    MimiConv1d(hidden, dim, 1)])
        self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in self.block:
            h = m(h)
        return x + h


class SEANetEncoder(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [MimiConv1d(c.audio_channels, c.num_filters, c.kernel_size)]
        scale = 1
        for ratio in reversed(c.upsampling_ratios):
            dim = scale * c.num_filters
            for j in range(c.num_residual_layers):
                layers.append(ResnetBlock(dim, dim // c.compress, c.residual_kernel_size, c.dilation_growth_rate**j))
            layers += [nn.ELU(), MimiConv1d(dim, dim * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), MimiConv1d(scale * c.num_filters, c.hidden_size, c.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers:
            x = m(x)
        return x


class MimiMlp(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MimiTransformerLayer(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.attention_bias)
        self.mlp = MimiMlp(c)
        self.input_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.self_attn_layer_scale = LayerScale(c.hidden_size, c.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(c.hidden_size, c.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask):
        h, _, _ = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        x = x + self.self_attn_layer_scale(h)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class MimiTransformer(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList(MimiTransformerLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device).expand(b, t)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        mask = sliding_window_mask(positions, positions, window=t + 1)  # plain causal
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


class MimiCodebook(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(c.codebook_size))
        self.register_buffer("embed_sum", torch.zeros(c.codebook_size, c.codebook_dim))

    def embed(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class MimiVectorQuantization(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.codebook = MimiCodebook(c)


class MimiResidualVectorQuantizer(nn.Module):
    def __init__(self, c: MimiEncoderConfig, num_quantizers: int):
        super().__init__()
        self.layers = nn.ModuleList(MimiVectorQuantization(c) for _ in range(num_quantizers))
        self.input_proj = self.output_proj = None
        if c.vector_quantization_hidden_dimension != c.hidden_size:
            self.input_proj = nn.Conv1d(c.hidden_size, c.vector_quantization_hidden_dimension, 1, bias=False)
            self.output_proj = nn.Conv1d(c.vector_quantization_hidden_dimension, c.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, num_quantizers: int) -> torch.Tensor:
        """x `[B, hidden, T]` -> codes `[num_quantizers, B, T]`, greedy residual nearest-codeword search."""
        residual = (self.input_proj(x) if self.input_proj is not None else x).transpose(1, 2)
        codes = []
        for layer in self.layers[:num_quantizers]:
            embed = layer.codebook.embed()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None].float(), embed[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(residual.shape[:-1])
            residual = residual - F.embedding(idx, embed)
            codes.append(idx)
        return torch.stack(codes)


class MimiSplitQuantizer(nn.Module):
    def __init__(self, c: MimiEncoderConfig):
        super().__init__()
        self.semantic_residual_vector_quantizer = MimiResidualVectorQuantizer(c, c.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = MimiResidualVectorQuantizer(
            c, c.num_quantizers - c.num_semantic_quantizers
        )

    def encode(self, x: torch.Tensor, num_quantizers: int) -> torch.Tensor:
        """-> `[B, num_quantizers, T]`."""
        codes = self.semantic_residual_vector_quantizer.encode(x, 1)
        if num_quantizers > 1:
            acoustic = self.acoustic_residual_vector_quantizer.encode(x, num_quantizers - 1)
            codes = torch.cat([codes, acoustic], dim=0)
        return codes.transpose(0, 1)


class CodecEncoder(nn.Module):
    """Official `Qwen3TTSTokenizerV2Encoder` (a MimiModel without its decoder half), same parameter names."""

    def __init__(self, config: MimiEncoderConfig, num_valid_quantizers: int = 16, samples_per_frame: int = 1920):
        super().__init__()
        self.config = config
        self.num_valid_quantizers = num_valid_quantizers
        self.samples_per_frame = samples_per_frame
        self.encoder = SEANetEncoder(config)
        self.encoder_transformer = MimiTransformer(config)
        self.downsample = MimiConv1d(config.hidden_size, config.hidden_size,
                                     kernel=2 * int(config.encodec_frame_rate / config.frame_rate), stride=2,
                                     bias=False, pad_mode="replicate")
        self.quantizer = MimiSplitQuantizer(config)

    @torch.no_grad()
    def encode(self, wav: torch.Tensor, sample_rate: int) -> torch.Tensor:
        """Mono clip `[N]` at the codec rate -> codes `[ceil(N / 1920), 16]` long."""
        if sample_rate != self.config.sampling_rate:
            raise ValueError(
                f"reference audio must be {self.config.sampling_rate} Hz (resample first), got {sample_rate}"
            )
        if wav.dim() != 1:
            raise ValueError(f"expected a mono clip [N], got shape {tuple(wav.shape)}")
        if wav.numel() == 0:
            raise ValueError("reference audio is empty")
        param = next(self.parameters())
        x = wav.to(device=param.device, dtype=param.dtype)[None, None]
        h = self.encoder(x)
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        h = self.downsample(h)
        codes = self.quantizer.encode(h, self.num_valid_quantizers)[0]
        num_frames = -(-wav.numel() // self.samples_per_frame)
        return codes[:, :num_frames].transpose(0, 1)
