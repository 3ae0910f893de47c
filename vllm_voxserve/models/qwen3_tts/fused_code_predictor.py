"""The code predictor's served frame: the procedure of `code_predictor.py`, rearranged into few, larger kernels.

A plain frame is about 2,000 small kernels, ≈ 9 ms on the H200 at any batch size (launch-bound; notes/qwen3-tts.md).
Here, with the same results:
- one QKV matrix and one gate/up matrix per layer (the official weights concatenated once);
- the input projection folded into the embedding tables: `proj(E_i(c))` is a row of a pre-projected table, so only
  the talker state goes through the projection matmul;
- attention over at most 16 positions as two small matmuls over the exact key prefix (positions are Python ints,
  so only the two-token first pass needs a mask);
- sampling over the `CANDIDATES` largest logits: temperature, top-k, top-p, then the exponential race with the same
  counter noise as `sampling.sample` read at the candidates' vocabulary ids. A row's codes are the reference's
  whenever 1 <= top_k <= CANDIDATES (the endpoint refuses other top-k for sampled rows); greedy rows use all logits.
`frame` is pure tensor code whose shapes depend only on the batch size: torch.compile fuses its element-wise work
and a CUDA graph captures it whole on GPU; CPU tests run it eagerly against the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_voxserve.models.seeded_noise import uniform_noise_at

from .code_predictor import CodePredictor
from .job import MAX_CODE_PREDICTOR_TOP_K as CANDIDATES
from .talker import rotary_cos_sin


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)  # as talker.RMSNorm


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FusedCodePredictor(nn.Module):
    """Fused weights of a loaded `CodePredictor` (copies; build after the checkpoint is loaded) and its frame."""

    def __init__(self, cp: CodePredictor):
        super().__init__()
        cfg = cp.config
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                            cfg.head_dim)
        self.eps, self.num_steps = cfg.rms_norm_eps, cp.num_groups - 1
        self.candidates = min(CANDIDATES, cfg.vocab_size)
        self.num_layers = len(cp.model.layers)
        layer0 = cp.model.layers[0].self_attn
        if layer0.q_proj.bias is not None:
            raise ValueError("the fused code predictor assumes attention without bias (as Qwen3-TTS has)")
        dev = cp.model.norm.weight.device
        with torch.no_grad():
            for i, layer in enumerate(cp.model.layers):
                attn, mlp = layer.self_attn, layer.mlp
                self._buffer(f"qkv{i}", torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
                self._buffer(f"o{i}", attn.o_proj.weight)
                self._buffer(f"q_norm{i}", attn.q_norm.weight)
                self._buffer(f"k_norm{i}", attn.k_norm.weight)
                self._buffer(f"norm_in{i}", layer.input_layernorm.weight)
                self._buffer(f"norm_post{i}", layer.post_attention_layernorm.weight)
                self._buffer(f"gate_up{i}", torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
                self._buffer(f"down{i}", mlp.down_proj.weight)
            self._buffer("final_norm", cp.model.norm.weight)
            self._buffer("heads", torch.stack([head.weight for head in cp.lm_head]))  # [15, V, H]
            proj = cp.small_to_mtp_projection
            self.project_hidden = not isinstance(proj, nn.Identity)
            if self.project_hidden:
                self._buffer("proj_w", proj.weight)
                self._buffer("proj_b", proj.bias)
            # table i embeds the code fed at step i: codebook 0 with the talker's table, then codebooks 1..14
            tables = [cp.codec_embedding0.weight] + [e.weight for e in cp.model.codec_embedding[: self.num_steps - 1]]
            for i, table in enumerate(tables):
                self._buffer(f"table{i}", self._projected(proj, table) if self.project_hidden else table)
            cos, sin = rotary_cos_sin(torch.arange(cp.num_groups, device=dev), cfg.head_dim, cfg.rope_theta,
                                      cp.model.norm.weight.dtype)
            self._buffer("cos", cos[:, None])  # [16, 1, d]: broadcast over heads
            self._buffer("sin", sin[:, None])
            self._buffer("first_pass_mask", torch.tensor([[True, False], [True, True]], device=dev))

    def _buffer(self, name: str, value: torch.Tensor) -> None:
        self.register_buffer(name, value.detach().clone(), persistent=False)

    @staticmethod
    def _projected(proj: nn.Linear, table: torch.Tensor) -> torch.Tensor:
        """proj(table) row by row, in fp32 and rounded once to the table's dtype."""
        out = F.linear(table.float(), proj.weight.float(), proj.bias.float())
        return out.to(table.dtype)

    def frame(self, hidden: torch.Tensor, c0: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
              top_p: torch.Tensor, seed: torch.Tensor, frame_index: torch.Tensor) -> torch.Tensor:
        """hidden [B,H_talker], c0 [B] and per-row sampling tensors [B] -> codes [B,15] of codebooks 1..15.

        temperature <= 0: greedy. seed/frame_index select the counter noise (`uniform_noise` draw = step)."""
        head = F.linear(hidden, self.proj_w, self.proj_b) if self.project_hidden else hidden
        x = torch.stack([head, self.table0[c0]], dim=1)  # [B,2,H]
        cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.num_layers
        codes, pos = [], 0
        for step in range(self.num_steps):
            t = x.shape[1]
            for i in range(self.num_layers):
                x = self._layer(i, x, pos, cache)
            logits = F.linear(_rms(x[:, -1], self.final_norm, self.eps), self.heads[step]).float()
            code = self._pick(logits, step, temperature, top_k, top_p, seed, frame_index)
            codes.append(code)
            pos += t
            if step < self.num_steps - 1:
                x = getattr(self, f"table{step + 1}")[code][:, None]
        return torch.stack(codes, dim=1)

    def _layer(self, i: int, x: torch.Tensor, pos: int, cache: list) -> torch.Tensor:
        b, t, _ = x.shape
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        rep = nh // nkv
        qkv = F.linear(_rms(x, getattr(self, f"norm_in{i}"), self.eps), getattr(self, f"qkv{i}"))
        q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
        cos, sin = self.cos[pos:pos + t], self.sin[pos:pos + t]
        q = _rotate(_rms(q.reshape(b, t, nh, d), getattr(self, f"q_norm{i}"), self.eps), cos, sin)
        k = _rotate(_rms(k.reshape(b, t, nkv, d), getattr(self, f"k_norm{i}"), self.eps), cos, sin)
        v = v.reshape(b, t, nkv, d)
        if cache[i] is not None:
            k, v = torch.cat([cache[i][0], k], dim=1), torch.cat([cache[i][1], v], dim=1)
        cache[i] = (k, v)
        # query head h reads kv head h // rep (the official repeat_interleave): group queries by kv head
        qg = q.reshape(b, t, nkv, rep, d).permute(0, 2, 1, 3, 4).reshape(b, nkv, t * rep, d)
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float() * d ** -0.5  # [B, nkv, t*rep, s]
        if t > 1:  # the first pass (positions 0 and 1) is causal; later passes see every cached key
            visible = self.first_pass_mask.repeat_interleave(rep, dim=0)
            scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.matmul(scores.softmax(dim=-1).to(x.dtype), v.permute(0, 2, 1, 3))  # [B, nkv, t*rep, d]
        out = out.reshape(b, nkv, t, rep, d).permute(0, 2, 1, 3, 4).reshape(b, t, nh * d)
        x = x + F.linear(out, getattr(self, f"o{i}"))
        gate, up = F.linear(_rms(x, getattr(self, f"norm_post{i}"), self.eps), getattr(self, f"gate_up{i}")).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, getattr(self, f"down{i}"))

    def _pick(self, logits, step: int, temperature, top_k, top_p, seed, frame_index) -> torch.Tensor:
        """`sampling.sample` with `uniform_noise(seed, frame_index, 15, V)[:, step]`, over the top candidates."""
        greedy = logits.argmax(dim=-1)
        temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        values, ids = logits.topk(self.candidates, dim=-1)  # sorted, largest first
        values = values / temp[:, None]
        k = top_k.clamp(1, self.candidates)
        values = values.masked_fill(values < values.gather(1, (k - 1)[:, None]), float("-inf"))
        probs = values.softmax(dim=-1)
        # top-p as HF: drop the smallest tokens while their total mass stays <= 1 - p; the largest always stays
        tail_mass = probs.flip(-1).cumsum(-1).flip(-1)
        not_first = torch.arange(self.candidates, device=logits.device) > 0
        drop = (tail_mass <= (1 - top_p.float())[:, None]) & (top_p < 1)[:, None] & not_first
        probs = values.masked_fill(drop, float("-inf")).softmax(dim=-1)
        noise = uniform_noise_at(seed, frame_index, step, ids)
        drawn = ids.gather(1, (probs / -torch.log(noise)).argmax(dim=-1, keepdim=True)).squeeze(1)
        return torch.where(temperature > 0, drawn, greedy)
