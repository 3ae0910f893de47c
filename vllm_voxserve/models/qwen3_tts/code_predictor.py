"""The Qwen3-TTS code predictor ("depth" transformer): codebooks 1..15 of a frame from the talker hidden state.

Official procedure per frame (notes §2): a fresh cache; pass 1 feeds `proj([h_t, E_0(c0)])` at positions 0 and 1
and `lm_head[0]` of the last position gives c1; pass i (1..14) feeds `proj(codec_embedding[i-1](c_i))` at position
i+1 and `lm_head[i]` gives c_{i+1}. `predict_frame` runs exactly that with a static K/V buffer of 16 positions made
fresh each call, fixed shapes, and no host sync, so the whole frame can be captured in one CUDA graph per batch size.
"""
from __future__ import annotations

import torch
from torch import nn

from .configuration import Qwen3TTSCodePredictorConfig
from .sampling import sample
from .decoder_layers import DecoderLayer, RMSNorm, rotary_cos_sin, sum_frame_embeddings


class CodePredictorModel(nn.Module):
    """`talker.code_predictor.model`: layers, norm, and the 15 residual-codebook tables (talker width)."""

    def __init__(self, config: Qwen3TTSCodePredictorConfig, embedding_dim: int):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(config.vocab_size, embedding_dim)
                                             for _ in range(config.num_code_groups - 1))


class CodePredictor(nn.Module):
    """`talker.code_predictor`. Call `bind_codec_embedding(talker.model.codec_embedding)` before use (the talker
    does): codebook 0 is embedded with the talker's table, which this module uses but does not own."""

    def __init__(self, config: Qwen3TTSCodePredictorConfig, talker_hidden_size: int):
        super().__init__()
        self.config = config
        self.num_groups = config.num_code_groups
        self.model = CodePredictorModel(config, talker_hidden_size)
        self.lm_head = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                                     for _ in range(config.num_code_groups - 1))
        if config.hidden_size != talker_hidden_size:
            self.small_to_mtp_projection = nn.Linear(talker_hidden_size, config.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        self.__dict__["_c0_embedding"] = None  # not a submodule: it belongs to the talker's state dict

    def bind_codec_embedding(self, embedding: nn.Embedding) -> None:
        self.__dict__["_c0_embedding"] = embedding

    @property
    def codec_embedding0(self) -> nn.Embedding:
        if self._c0_embedding is None:
            raise RuntimeError("call bind_codec_embedding(talker.model.codec_embedding) first")
        return self._c0_embedding

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,16] -> [B,H_talker]: the codec term of the next talker input (official cat + sum order)."""
        return sum_frame_embeddings(self.codec_embedding0, self.model.codec_embedding, codes)

    def teacher_forced_logits(self, talker_hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """One causal pass over [h, E_0(c0), E_1(c1), ..., E_14(c14)] -> logits [B,15,V] for c1..c15 (training path)."""
        inputs = [talker_hidden[:, None], self.codec_embedding0(codes[:, :1])]
        inputs += [self.model.codec_embedding[q - 1](codes[:, q:q + 1]) for q in range(1, self.num_groups - 1)]
        x = self.small_to_mtp_projection(torch.cat(inputs, dim=1))
        pos = torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = rotary_cos_sin(pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return torch.stack([self.lm_head[g](x[:, g + 1]) for g in range(self.num_groups - 1)], dim=1)

    def predict_frame(self, talker_hidden: torch.Tensor, c0: torch.Tensor, temperature: torch.Tensor | None = None,
                      top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                      generator: torch.Generator | None = None, uniform: torch.Tensor | None = None) -> torch.Tensor:
        """talker_hidden [B,H] (final-norm talker state that produced c0), c0 [B] -> codes [B,15] for codebooks 1..15.

        temperature/top_k/top_p: per-row tensors [B]; temperature None (or <= 0 in a row) means greedy.
        uniform [B,15,V] in (0,1): the draws of sampled rows, given instead of the RNG (per-request seeded noise
        makes a request's codes independent of the batch it runs in)."""
        codes, _ = self.run_frame(talker_hidden, c0, temperature, top_k, top_p, generator, uniform=uniform)
        return codes

    def run_frame(self, talker_hidden, c0, temperature=None, top_k=None, top_p=None, generator=None,
                  forced_codes: torch.Tensor | None = None, uniform: torch.Tensor | None = None):
        """`predict_frame` plus the logits [B,15,V] of each step; forced_codes [B,15] feeds given codes instead of
        the picked ones (teacher forcing through the incremental path, for tests)."""
        cfg = self.config
        b, groups = talker_hidden.shape[0], self.num_groups
        x = self.small_to_mtp_projection(torch.stack([talker_hidden, self.codec_embedding0(c0)], dim=1))
        dtype, device = x.dtype, x.device
        cos, sin = rotary_cos_sin(torch.arange(groups, device=device)[None], cfg.head_dim, cfg.rope_theta, dtype)
        visible = torch.ones(groups, groups, dtype=torch.bool, device=device).tril()
        shape = (b, cfg.num_key_value_heads, groups, cfg.head_dim)
        cache = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for _ in self.model.layers]
        picked, logits_all, pos = [], [], 0
        for step in range(groups - 1):
            t = x.shape[1]
            h = x
            for layer, (k_buf, v_buf) in zip(self.model.layers, cache):
                h = _layer_step(layer, h, cos[:, pos:pos + t], sin[:, pos:pos + t], k_buf, v_buf, pos,
                                visible[pos:pos + t])
            logits = self.lm_head[step](self.model.norm(h[:, -1]))
            code = sample(logits.float(), temperature, top_k, top_p, generator,
                          uniform=None if uniform is None else uniform[:, step])
            logits_all.append(logits)
            picked.append(code)
            pos += t
            if step < groups - 2:
                fed = code if forced_codes is None else forced_codes[:, step]
                x = self.small_to_mtp_projection(self.model.codec_embedding[step](fed)[:, None])
        return torch.stack(picked, dim=1), torch.stack(logits_all, dim=1)


def _layer_step(layer: DecoderLayer, x, cos, sin, k_buf, v_buf, pos: int, visible: torch.Tensor) -> torch.Tensor:
    """One decoder layer over `x` [B,t,H] at positions pos..pos+t-1, writing K/V into the static buffers."""
    attn = layer.self_attn
    q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)
    t = x.shape[1]
    k_buf[:, :, pos:pos + t] = k
    v_buf[:, :, pos:pos + t] = v
    # keys past pos+t-1 are zeros and masked out; the mask depends only on the Python step, not on tensor values
    x = x + attn.attend(q, k_buf, v_buf, visible, is_causal=False)
    return x + layer.mlp(layer.post_attention_layernorm(x))
