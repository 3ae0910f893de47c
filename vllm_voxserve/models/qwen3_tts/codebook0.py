"""Codebook 0's draw of the served talker, at the end of the step's forward.

Each request draws with the official talker rules and warpers (`sampling`) and its own counter noise (seed, tokens
generated so far), so its codes do not depend on its batch. The draw runs on the rows vLLM will sample (each
request's last row of the step) inside the forward, so it is part of the step's CUDA graph: Model Runner V2 calls
`compute_logits` eagerly on the engine's one thread, where each of the draw's ~45 ops was a kernel launch's host time
every step. vLLM then gets the drawn id as the only finite logit, which any of its samplers keeps.

Nothing inside a graph may branch on the step's values, so every row runs the whole composition (top-k, top-p, the
noise): a greedy row, or a top-p of 1, gives the id that skipping those parts would.
"""

from __future__ import annotations

import torch

from vllm_voxserve.models.seeded_noise import noise_part, unit

from .prompt import TalkerGenerationRules
from .sampling import apply_talker_rules, sample
from .step_buffers import StepBuffers

# The draw of codebook 0 in a frame's counter noise: the code predictor's codebooks 1..15 take draws 0..14.
CODEBOOK0_DRAW = 15


class Codebook0Draw:
    """rules: the talker's; suppressed: [V] bool on the model's device (ids the talker never emits)."""

    def __init__(self, rules: TalkerGenerationRules, suppressed: torch.Tensor):
        self.rules, self.suppressed = rules, suppressed
        # the (draw, index) half of the noise, the same at every step; made before any graph capture reads it
        self.noise_part = noise_part(CODEBOOK0_DRAW, torch.arange(suppressed.shape[0], device=suppressed.device))[None]

    def __call__(self, logits: torch.Tensor, buffers: StepBuffers) -> torch.Tensor:
        """logits [R, V] of the step's sample rows 0..R-1 (`buffers.sample_*`) -> the drawn ids [R]."""
        rows = logits.shape[0]
        mask = self.suppressed[None, :].expand(rows, -1).clone()
        mask[:, self.rules.eos_id] = buffers.suppress_eos[:rows]
        seen = buffers.seen.index_select(0, buffers.sample_slot[:rows])
        processed = apply_talker_rules(logits, self.rules, buffers.sample_step[:rows], mask, seen,
                                       buffers.sample_penalty[:rows])
        noise = unit(buffers.sample_noise_base[:rows, None], self.noise_part)
        return sample(processed, buffers.sample_temperature[:rows], buffers.sample_top_k[:rows],
                      buffers.sample_top_p[:rows], uniform=noise)
