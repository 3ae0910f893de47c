"""The code predictor's served frame: the procedure of `code_predictor.py`, rearranged into few, larger kernels.

A plain frame is about 2,000 small kernels, ≈ 9 ms on the H200 at any batch size (launch-bound; notes/qwen3-tts.md).
Here, with the same results:
- one QKV matrix and one gate/up matrix per layer (the official weights concatenated once);
- the input projection folded into the embedding tables: `proj(E_i(c))` is a row of a pre-projected table, so only
  the talker state goes through the projection matmul;
- attention over fixed-size K/V caches of all 16 positions, masked past each query's own (every one-token pass has
  the same shapes), optionally as one operator per pass (`cp_kernels.py`: one Triton kernel on GPU);
- the candidates of each sampling step by `torch.topk`, or optionally one sorting kernel (`cp_kernels.py`);
- sampling over the `CANDIDATES` largest logits: temperature, top-k, top-p, then the exponential race with the same
  counter noise as `sampling.sample` read at the candidates' vocabulary ids. A row's codes are the reference's
  whenever 1 <= top_k <= CANDIDATES (the endpoint refuses other top-k for sampled rows); greedy rows use all logits.
`frame` is pure tensor code whose shapes depend only on the batch size: torch.compile fuses the element-wise work of
its two repeated pieces (`compile`) and a CUDA graph captures it whole on GPU; CPU tests run it eagerly against
the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_voxserve.models.seeded_noise import uniform_noise_at

from .code_predictor import CodePredictor
from .cp_kernels import attention_reference, code_predictor_attention, rms_norm, top_candidates
from .job import MAX_CODE_PREDICTOR_TOP_K as CANDIDATES
from .decoder_layers import DecoderLayer, rotary_cos_sin


class FusedCodePredictor(nn.Module):
    """Fused weights of a loaded `CodePredictor` (copies; build after the checkpoint is loaded) and its frame."""

    def __init__(self, cp: CodePredictor, kernels: bool = False):
        super().__init__()
        cfg = cp.config
        self.kernels = kernels  # each pass's attention and each step's top candidates as our operators (cp_kernels.py)
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                            cfg.head_dim)
        self.eps, self.num_steps = cfg.rms_norm_eps, cp.num_groups - 1
        self.candidates = min(CANDIDATES, cfg.vocab_size)
        self.num_layers = len(cp.model.layers)
        layer0 = cp.model.layers[0].self_attn
        if layer0.q_proj.bias is not None:
            raise ValueError("the fused code predictor assumes attention without bias (as Qwen3-TTS has)")
        dev = cp.model.norm.weight.device
        self._layer_pass, self._head_pick, self._compiled = layer_pass, self._head_pick_eager, False
        with torch.no_grad():
            for i, layer in enumerate(cp.model.layers):
                for name, weight in zip(_LAYER_WEIGHTS, fused_layer_weights(layer), strict=True):
                    self._buffer(f"{name}{i}", weight)
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
            positions = torch.arange(cp.num_groups, device=dev)
            self._buffer("positions", positions)
            self._buffer("step_ids", torch.arange(self.num_steps, device=dev))

    def _buffer(self, name: str, value: torch.Tensor) -> None:
        self.register_buffer(name, value.detach().clone(), persistent=False)

    @staticmethod
    def _projected(proj: nn.Linear, table: torch.Tensor) -> torch.Tensor:
        """proj(table) row by row, in fp32 and rounded once to the table's dtype."""
        out = F.linear(table.float(), proj.weight.float(), proj.bias.float())
        return out.to(table.dtype)

    def compile(self, mode: str | None = None) -> None:
        """Compile the two pieces a frame repeats (one layer pass, one head + pick) with a dynamic batch size: a
        few small graphs compile in seconds, where the whole unrolled frame (75 layer passes) takes minutes.
        mode: torch.compile's (e.g. "max-autotune-no-cudagraphs"; the frame is captured in our own graphs)."""
        self._layer_pass = torch.compile(layer_pass, fullgraph=True, mode=mode)
        self._head_pick = torch.compile(self._head_pick_eager, fullgraph=True, mode=mode)
        self._compiled = True

    def frame(self, hidden: torch.Tensor, c0: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
              top_p: torch.Tensor, seed: torch.Tensor, frame_index: torch.Tensor) -> torch.Tensor:
        """hidden [B,H_talker], c0 [B] and per-row sampling tensors [B] -> codes [B,15] of codebooks 1..15.

        temperature <= 0: greedy. seed/frame_index select the counter noise (`uniform_noise` draw = step)."""
        b, groups = hidden.shape[0], self.num_steps + 1
        head = F.linear(hidden, self.proj_w, self.proj_b) if self.project_hidden else hidden
        x = torch.stack([head, self.table0[c0]], dim=1)  # [B,2,H]: positions 0 and 1
        # fixed-size K/V per layer (all 16 positions, masked beyond the current one): every one-token pass has the
        # same shapes, so one compiled graph serves them all
        shape = (b, self.num_kv_heads, groups, self.head_dim)  # heads before positions: attention reads them as is
        caches = [(x.new_zeros(shape), x.new_zeros(shape)) for _ in range(self.num_layers)]
        row_params = (temperature, top_k, top_p, seed, frame_index)
        for t in (*row_params, *(c for kv in caches for c in kv)):
            self._batch_dynamic(t)
        codes, pos, weights = [], 0, self.layer_weights
        for step in range(self.num_steps):
            t = x.shape[1]
            span = slice(pos, pos + t)
            for (k_cache, v_cache), layer in zip(caches, weights, strict=True):
                x = self._layer_pass(self._batch_dynamic(x), k_cache, v_cache, self.cos[span], self.sin[span],
                                     self.positions[span], *layer, self.num_heads, self.eps, self.kernels)
            code = self._head_pick(self._batch_dynamic(x[:, -1]), self.heads[step], self.step_ids[step], *row_params)
            codes.append(code)
            pos += t
            if step < self.num_steps - 1:
                x = getattr(self, f"table{step + 1}")[code][:, None]
        return torch.stack(codes, dim=1)

    def _batch_dynamic(self, t: torch.Tensor) -> torch.Tensor:
        """Tell torch.compile that dim 0 (the batch) varies, so one graph serves every batch size (>= 2)."""
        if self._compiled:
            torch._dynamo.mark_dynamic(t, 0)
        return t

    @property
    def layer_weights(self) -> list[tuple[torch.Tensor, ...]]:
        return [tuple(getattr(self, f"{name}{i}") for name in _LAYER_WEIGHTS) for i in range(self.num_layers)]

    def _head_pick_eager(self, x_last, head_weight, step, temperature, top_k, top_p, seed, frame_index):
        """`sampling.sample` of this step's logits with `uniform_noise(seed, frame_index, 15, V)[:, step]`, over
        the top candidates. step: a 0-d tensor (one compiled graph for every step)."""
        logits = F.linear(rms_norm(x_last, self.final_norm, self.eps), head_weight).float()
        greedy = logits.argmax(dim=-1)
        temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        # sorted, largest first
        values, ids = top_candidates(logits, self.candidates) if self.kernels else logits.topk(self.candidates, dim=-1)
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


_LAYER_WEIGHTS = ("norm_in", "qkv", "q_norm", "k_norm", "o", "norm_post", "gate_up", "down")


def fused_layer_weights(layer: DecoderLayer) -> tuple[torch.Tensor, ...]:
    """A Qwen3 decoder layer's weights in `layer_pass` order, QKV and gate/up concatenated (views of the rest)."""
    attn, mlp = layer.self_attn, layer.mlp
    return (layer.input_layernorm.weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            attn.q_norm.weight, attn.k_norm.weight, attn.o_proj.weight, layer.post_attention_layernorm.weight,
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight)


def layer_pass(x, k_cache, v_cache, cos, sin, positions, norm_in, qkv_w, q_norm, k_norm, o_w, norm_post, gate_up_w,
               down_w, num_heads: int, eps: float, attention_kernel: bool = False) -> torch.Tensor:
    """One decoder layer over x [B,t,H] at `positions` [t]: writes their K/V into the caches [B,kv_heads,P,d] (in
    place) and attends over the cached positions up to each one's own (`cp_kernels`; with `attention_kernel`, as
    one operator: one Triton kernel on GPU)."""
    qkv = F.linear(rms_norm(x, norm_in, eps), qkv_w)
    attention = code_predictor_attention if attention_kernel else attention_reference
    out = attention(qkv, q_norm, k_norm, cos, sin, positions, k_cache, v_cache, num_heads, eps)
    x = x + F.linear(out, o_w)
    gate, up = F.linear(rms_norm(x, norm_post, eps), gate_up_w).chunk(2, -1)
    return x + F.linear(F.silu(gate) * up, down_w)
