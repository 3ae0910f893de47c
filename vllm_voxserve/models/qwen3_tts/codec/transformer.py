"""The decoder's `pre_transformer`: 8 pre-norm layers with causal sliding-window attention (window W = 72 frames),
RoPE (theta 1e4) on absolute frame positions, LayerScale, SwiGLU; official parameter names.

Streaming keeps, per layer, the RoPE-rotated K and V of the last W-1 frames (`[B, kv_heads, W-1, head_dim]`), which
is everything a new frame can see. Masks and positions come from a per-row position tensor on the device, so rows at
different positions batch together and nothing depends on host values."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .configuration import CodecDecoderConfig
from .layers import State


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)  # cast before the weight, as the official norm does


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial_scale: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(initial_scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin `[B, T, head_dim]` for integer positions `[B, T]`, computed in fp32 as the official rotary embedding."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = (inv_freq[None, :, None] @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def sliding_window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int) -> torch.Tensor:
    """`[B, 1, Q, K]` bool, True where key j is visible to query i: key_pos >= 0 and 0 <= q - k < window."""
    delta = query_pos[:, :, None] - key_pos[:, None, :]
    visible = (delta >= 0) & (delta < window) & (key_pos[:, None, :] >= 0)
    return visible[:, None]


class Attention(nn.Module):
    """RoPE attention with q/k/v/o projections (no QK-norm); also used by the Mimi encoder transformer."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)

    def forward(self, x, cos, sin, mask, past_key=None, past_value=None):
        """x `[B, T, hidden]`; returns the output and this call's full K/V (past ++ new, RoPE applied)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past_key is not None:
            k = torch.cat([past_key, k], dim=2)
            v = torch.cat([past_value, v], dim=2)
        groups = self.num_heads // self.num_kv_heads
        k_all = k.repeat_interleave(groups, dim=1) if groups > 1 else k
        v_all = v.repeat_interleave(groups, dim=1) if groups > 1 else v
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), k, v


class Mlp(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.self_attn = Attention(
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.attention_bias,
        )
        self.mlp = Mlp(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask, past_key=None, past_value=None):
        h, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_key, past_value)
        x = x + self.self_attn_layer_scale(h)
        x = x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))
        return x, k, v


class PreTransformer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.state_name = "pre_transformer"

    def cache_names(self, layer: int) -> tuple[str, str]:
        return f"{self.state_name}.layers.{layer}.key", f"{self.state_name}.layers.{layer}.value"

    def cache_shape(self) -> tuple[int, int, int]:
        c = self.config
        return (c.num_key_value_heads, c.sliding_window - 1, c.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `[B, T, latent]` -> `[B, T, latent]`, positions 0..T-1."""
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device).expand(b, t)
        h = self.input_proj(x)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, h.dtype)
        mask = sliding_window_mask(positions, positions, self.config.sliding_window)
        for layer in self.layers:
            h, _, _ = layer(h, cos, sin, mask)
        return self.output_proj(self.norm(h))

    def stream(self, x: torch.Tensor, start: torch.Tensor, state: State) -> torch.Tensor:
        """x `[B, F, latent]` holds frames start..start+F-1 of each row (`start` `[B]` long, on the device)."""
        b, f, _ = x.shape
        past = self.config.sliding_window - 1
        query_pos = start[:, None] + torch.arange(f, device=x.device)
        key_pos = start[:, None] - past + torch.arange(past + f, device=x.device)
        h = self.input_proj(x)
        cos, sin = rope_cos_sin(query_pos, self.config.head_dim, self.config.rope_theta, h.dtype)
        mask = sliding_window_mask(query_pos, key_pos, self.config.sliding_window)
        for i, layer in enumerate(self.layers):
            key_name, value_name = self.cache_names(i)
            h, k, v = layer(h, cos, sin, mask, state[key_name], state[value_name])
            state[key_name] = k[:, :, k.shape[2] - past :]
            state[value_name] = v[:, :, v.shape[2] - past :]
        return self.output_proj(self.norm(h))
