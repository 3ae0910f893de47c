"""Logits rules and sampling of the Qwen3-TTS talker and code predictor, as the official HF 4.57 processors do them.

Talker (codebook 0): logits in fp32 -> repetition penalty on the codebook-0 ids generated so far -> EOS masked
while fewer than `min_new_tokens` were generated -> suppressed specials masked -> (sampling only) temperature ->
top-k -> top-p -> softmax -> multinomial. Greedy rows take the argmax of the processed logits (no warpers).
Code predictor: the same warpers, no penalty / min-length / suppression.

Everything is per row and tensor-only (no `.item()`, no branching on tensor values), so it can run inside a CUDA
graph. A row with temperature <= 0 is greedy.
"""
from __future__ import annotations

import torch

from .prompt import TalkerGenerationRules


def suppression_mask(rules: TalkerGenerationRules, vocab_size: int, device=None) -> torch.Tensor:
    """[V] bool, True for the ids the talker may never emit."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[list(rules.suppressed_ids)] = True
    return mask


def seen_mask(generated: list[list[int]], vocab_size: int, device=None) -> torch.Tensor:
    """[B,V] bool from per-row lists of generated codebook-0 ids (for the repetition penalty)."""
    mask = torch.zeros(len(generated), vocab_size, dtype=torch.bool, device=device)
    for row, ids in enumerate(generated):
        if ids:
            mask[row, torch.tensor(ids, dtype=torch.long)] = True
    return mask


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor | float) -> torch.Tensor:
    """HF rule on the seen ids: negative scores times the penalty, others divided by it (penalty: float or [B])."""
    if isinstance(penalty, torch.Tensor) and penalty.dim() == 1:
        penalty = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def apply_talker_rules(logits: torch.Tensor, rules: TalkerGenerationRules, num_generated: torch.Tensor,
                       suppressed: torch.Tensor, seen: torch.Tensor | None = None,
                       repetition_penalty: torch.Tensor | float = 1.05) -> torch.Tensor:
    """logits [B,V] -> fp32 logits with the talker rules applied; num_generated [B]: codebook-0 ids so far."""
    out = logits.float()
    if seen is not None:
        out = apply_repetition_penalty(out, seen, repetition_penalty)
    # masked_fill with a Python scalar: no host-to-device copy, so this also runs under CUDA graph capture
    too_early = (num_generated < rules.min_new_tokens)[:, None]
    is_eos = torch.arange(out.shape[-1], device=out.device) == rules.eos_id
    return out.masked_fill(too_early & is_eos, float("-inf")).masked_fill(suppressed, float("-inf"))


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """HF Temperature -> TopK (k <= 0: off; keeps ties with the k-th) -> TopP (p >= 1: off; keeps >= 1 token)."""
    vocab = logits.shape[-1]
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(logits.dtype)
    out = logits / temp[:, None]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    kth = out.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None].long())
    out = out.masked_fill(out < kth, float("-inf"))
    sorted_logits, sorted_idx = out.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p.to(cum.dtype))[:, None]
    remove_sorted[:, -1] = False
    remove_sorted &= (top_p < 1)[:, None]
    remove = torch.zeros_like(remove_sorted).scatter(1, sorted_idx, remove_sorted)
    return out.masked_fill(remove, float("-inf"))


def sample(logits: torch.Tensor, temperature: torch.Tensor | None = None, top_k: torch.Tensor | None = None,
           top_p: torch.Tensor | None = None, generator: torch.Generator | None = None,
           uniform: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B,V] (already processed) -> ids [B]. temperature None: all greedy; rows with temperature <= 0 greedy.

    Sampled rows draw with `torch.multinomial` as HF does, so a seeded CPU run consumes the RNG identically."""
    greedy = logits.argmax(dim=-1)
    if temperature is None:
        return greedy
    b = logits.shape[0]
    if top_k is None:
        top_k = torch.zeros(b, dtype=torch.long, device=logits.device)
    if top_p is None:
        top_p = torch.ones(b, dtype=logits.dtype, device=logits.device)
    probs = warp(logits.float(), temperature, top_k, top_p).softmax(dim=-1)
    if uniform is None:
        drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    else:  # exponential race: argmax p_i / E_i with E_i = -log U_i picks i with probability p_i
        drawn = (probs / -torch.log(uniform.to(probs.dtype))).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy)


def full(batch: int, value: float | int, device=None, dtype=None) -> torch.Tensor:
    """A per-row parameter tensor with one value (helper for callers with batch-wide settings)."""
    return torch.full((batch,), value, device=device, dtype=dtype or (torch.long if isinstance(value, int)
                                                                     and not isinstance(value, bool)
                                                                     else torch.float32))
