"""The Qwen3-TTS talker in plain PyTorch, with the official parameter names (so checkpoints load by name).

The decoder layer here is shared with the code predictor: both are Qwen3 layers (QK RMSNorm before RoPE, SwiGLU).
The talker's interleaved M-RoPE is exactly 1-D RoPE because TTS always gives the three position streams the same
values (notes §1.1), so one rotary helper serves both. `TextProjection`, `embed_plan` and the codec embedding sum are
what the vLLM model reuses; only the decoder layers are replaced there.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .configuration import Qwen3TTSTalkerConfig
from .prompt import CodecKind, InputPlan


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


class TextProjection(nn.Module):
    """The official ResizeMLP: text embedding (text_hidden_size) -> talker hidden, token by token."""

    def __init__(self, text_hidden_size: int, hidden_size: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden_size, text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    """`talker.model`: decoder layers, final norm, and the two input embedding tables."""

    def __init__(self, config: Qwen3TTSTalkerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)

    def forward(self, inputs_embeds: torch.Tensor, kv: KVCache | None = None) -> torch.Tensor:
        """inputs_embeds [B,T,H] continuing the cache (unpadded rows) -> final-norm hidden states [B,T,H]."""
        start = kv.length(0) if kv is not None else 0
        positions = torch.arange(start, start + inputs_embeds.shape[1], device=inputs_embeds.device)[None]
        cos, sin = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, inputs_embeds.dtype)
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv, i)
        return self.norm(x)


def sum_frame_embeddings(codec_embedding: nn.Embedding, residual_embeddings: Sequence[nn.Embedding],
                         codes: torch.Tensor) -> torch.Tensor:
    """codes [..., G] -> [..., H]: E_0(c_0) + sum_q E_q(c_q), summed as the official code (cat then sum, model dtype)."""
    parts = [codec_embedding(codes[..., :1])]
    parts += [emb(codes[..., q:q + 1]) for q, emb in enumerate(residual_embeddings, start=1)]
    return torch.cat(parts, dim=-2).sum(-2)


class Talker(nn.Module):
    """`talker`: model, text_projection, codec_head and code_predictor."""

    def __init__(self, config: Qwen3TTSTalkerConfig):
        super().__init__()
        from .code_predictor import CodePredictor  # the predictor imports the shared layers from here

        self.config = config
        self.model = TalkerModel(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor_config, config.hidden_size)
        self.code_predictor.bind_codec_embedding(self.model.codec_embedding)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """P(id) for text-stream ids [...] -> [..., H]."""
        return self.text_projection(self.model.text_embedding(ids))

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,16] of one frame -> [B,H], the codec term of the next talker input."""
        return sum_frame_embeddings(self.model.codec_embedding, self.code_predictor.model.codec_embedding, codes)


def embed_plan(plan: InputPlan, text_projection: TextProjection, text_embedding: nn.Embedding,
               codec_embedding: nn.Embedding, residual_embeddings: Sequence[nn.Embedding],
               x_vector: torch.Tensor | None = None, ref_codes: torch.Tensor | None = None):
    """A plan -> (prefill embeddings [L,H], trailing text embeddings [N,H]) as the official `generate` builds them.

    x_vector [H]: the Base speaker embedding; ref_codes [F,16]: the ICL reference frames (codec encoder output).
    Text terms go through `text_projection` in one call per stream, codec terms are looked up per slot. The plan's
    ids and rows reach the device in one copy that does not wait for the device: served, this runs while the
    previous engine step is on the GPU, and a blocking copy (`torch.tensor(..., device=)`, a list as an index) would
    wait for that step to end."""
    device = codec_embedding.weight.device
    kinds = [slot.kind for slot in plan.codec]
    token_rows = [i for i, k in enumerate(kinds) if k == CodecKind.TOKEN]
    speaker_rows = [i for i, k in enumerate(kinds) if k == CodecKind.SPEAKER]
    frame_rows = [i for i, k in enumerate(kinds) if k == CodecKind.REF_FRAME]
    text_ids = [*plan.text_ids, *plan.trailing_text_ids]
    token_ids = [plan.codec[i].value for i in token_rows]
    frames = [plan.codec[i].value for i in frame_rows]
    if frames and (ref_codes is None or ref_codes.shape[0] <= max(frames)):
        raise ValueError(f"this plan needs {max(frames) + 1} reference frames [F,16]")
    staged = _to_device(text_ids + token_rows + token_ids + speaker_rows + frame_rows + frames, device)
    parts = staged.split([len(text_ids), len(token_rows), len(token_ids), len(speaker_rows), len(frame_rows),
                          len(frames)])
    text = text_projection(text_embedding(parts[0]))
    prefill_text, trailing = text[:len(plan)], text[len(plan):]
    codec = torch.zeros_like(prefill_text)
    if token_rows:
        codec.index_copy_(0, parts[1], codec_embedding(parts[2]))
    if speaker_rows:
        if x_vector is None:
            raise ValueError("this plan has a speaker slot: pass the x-vector [H]")
        speaker = x_vector.to(device=device, dtype=codec.dtype).reshape(1, -1).expand(len(speaker_rows), -1)
        codec.index_copy_(0, parts[3], speaker)
    if frame_rows:
        codes = ref_codes.to(device).index_select(0, parts[5])  # served, the codes are already on the device
        codec.index_copy_(0, parts[4], sum_frame_embeddings(codec_embedding, residual_embeddings, codes)
                          .to(codec.dtype))
    return prefill_text + codec, trailing


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 [len(values)] on `device`; on CUDA through pinned memory, queued behind the stream's work, not waited on."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def embed_plan_with(talker: Talker, plan: InputPlan, x_vector=None, ref_codes=None):
    """`embed_plan` with the modules of a `Talker`."""
    return embed_plan(plan, talker.text_projection, talker.model.text_embedding, talker.model.codec_embedding,
                      talker.code_predictor.model.codec_embedding, x_vector, ref_codes)
