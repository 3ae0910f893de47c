"""A plain reference generate loop for one request (tests, CPU baseline): codes as the official `generate()`.

Per frame t (notes §1.4): c0 from the processed talker logits; stop on EOS; c1..c15 from the code predictor on the
talker hidden state; the next talker input is the frame's embedding sum plus the trailing text term of step t.
The frame of the last sampled token is never produced, so without EOS `max_new_tokens=N` gives N-1 frames.
Sampled runs draw in the official order (15 code-predictor draws, then 1 talker draw per frame), so a seeded CPU
run with the global RNG reproduces the official sampled codes too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoder_layers import KVCache
from .prompt import InputPlan, TalkerGenerationRules
from .sampling import apply_talker_rules, full, sample, suppression_mask
from .talker import Talker, embed_plan_with


@dataclass(frozen=True)
class SamplingConfig:
    """The official generate arguments (defaults: generation_config.json of the released checkpoints)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    repetition_penalty: float = 1.05
    max_new_tokens: int = 2048

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("temperature", "subtalker_temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 (use do_sample=False for greedy), got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")


GREEDY = SamplingConfig(do_sample=False, subtalker_dosample=False)


@dataclass
class ReferenceOutput:
    codes: torch.Tensor  # [N_frames, 16]
    talker_logits: list[torch.Tensor]  # processed fp32 logits [V] of each sampled codebook-0 token
    hit_eos: bool


@torch.no_grad()
def generate(talker: Talker, plan: InputPlan, rules: TalkerGenerationRules, sampling: SamplingConfig = GREEDY,
             x_vector: torch.Tensor | None = None, ref_codes: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> ReferenceOutput:
    """Codes [N,16] for one request, as the official `Qwen3TTSForConditionalGeneration.generate` returns them."""
    device = talker.codec_head.weight.device
    prefill, trailing = embed_plan_with(talker, plan, x_vector, ref_codes)
    pad_embed = talker.text_embed(torch.tensor([plan.tts_pad_id], device=device))[0]
    vocab = talker.config.vocab_size
    suppressed = suppression_mask(rules, vocab, device)
    talker_params = _params(sampling.do_sample, sampling.temperature, sampling.top_k, sampling.top_p, device)
    cp_params = _params(sampling.subtalker_dosample, sampling.subtalker_temperature, sampling.subtalker_top_k,
                        sampling.subtalker_top_p, device)
    seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
    kv = KVCache(len(talker.model.layers))
    hidden = talker.model(prefill[None], kv)[:, -1]
    frames, processed, hit_eos = [], [], False
    for step in range(sampling.max_new_tokens):
        logits = apply_talker_rules(talker.codec_head(hidden), rules, torch.tensor([step], device=device),
                                    suppressed, seen, sampling.repetition_penalty)
        processed.append(logits[0])
        c0 = sample(logits, *talker_params, generator=generator)
        if bool(c0[0] == rules.eos_id):
            hit_eos = True
            break
        if step == sampling.max_new_tokens - 1:  # the last token's frame is never produced
            break
        seen[0, c0[0]] = True
        rest = talker.code_predictor.predict_frame(hidden, c0, *cp_params, generator=generator)
        frame = torch.cat([c0[:, None], rest], dim=1)
        frames.append(frame[0])
        text = trailing[step] if step < trailing.shape[0] else pad_embed
        x = talker.frame_embedding(frame) + text
        hidden = talker.model(x[:, None], kv)[:, -1]
    codes = torch.stack(frames) if frames else torch.zeros(0, talker.config.num_code_groups, dtype=torch.long)
    return ReferenceOutput(codes, processed, hit_eos)


def _params(do_sample: bool, temperature: float, top_k: int, top_p: float, device):
    if not do_sample:
        return None, None, None
    return full(1, float(temperature), device), full(1, int(top_k), device), full(1, float(top_p), device)
