"""The decoder layers the talker and the code predictor share, in plain PyTorch with the official parameter names.

Both are Qwen3 layers (QK RMSNorm before RoPE, SwiGLU). The talker's interleaved M-RoPE is exactly 1-D RoPE because
TTS always gives the three position streams the same values (notes §1.1), so one rotary helper serves both.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # cast back to the input dtype before the weight multiply, as the official norm does (bit parity in bf16)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin [..., T, head_dim] for integer positions [..., T]: fp32 then cast, rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B,heads,T,d], k and v [B,kv_heads,T,d] with QK-norm and RoPE applied; cos/sin [B or 1,T,d]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               is_causal: bool) -> torch.Tensor:
        """SDPA over keys [B,kv_heads,S,d]; mask is boolean [.., T, S] (True = visible) or None."""
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:  # each kv head serves `rep` consecutive query heads, as the official repeat_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal and mask is None)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, kv: "KVCache | None" = None, layer: int = 0) -> torch.Tensor:
        """Full causal attention over the cached keys plus `x` [B,T,H] (the sequence continues the cache)."""
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        past = 0
        if kv is not None:
            past = kv.length(layer)
            k, v = kv.append(layer, k, v)
        t, s = q.shape[2], k.shape[2]
        mask = None
        if past and t > 1:  # causal with an offset: query i sees keys 0..past+i
            mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=past)
        x = x + self.self_attn.attend(q, k, v, mask, is_causal=t > 1)
        return x + self.mlp(self.post_attention_layernorm(x))


class KVCache:
    """Growing per-layer K/V (reference and tests; vLLM owns the serving cache)."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def length(self, layer: int) -> int:
        return 0 if self.keys[layer] is None else self.keys[layer].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def sum_frame_embeddings(codec_embedding: nn.Embedding, residual_embeddings: Sequence[nn.Embedding],
                         codes: torch.Tensor) -> torch.Tensor:
    """codes [..., G] -> [..., H]: E_0(c_0) + sum_q E_q(c_q), summed as the official code (cat then sum, model dtype)."""
    parts = [codec_embedding(codes[..., :1])]
    parts += [emb(codes[..., q:q + 1]) for q, emb in enumerate(residual_embeddings, start=1)]
    return torch.cat(parts, dim=-2).sum(-2)
