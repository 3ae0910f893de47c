"""What one engine step computes, row by row, in a form both of vLLM's model runners can produce.

The model needs to know which request each flattened token row belongs to and where in that request it is
(vLLM's forward context carries no request ids). The V1 runner (CPU) and Model Runner V2 (GPU) each build a
`StepLayout` from their own batch state and hand it to the model before the forward: everything after that point is
the same code on both machines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepLayout:
    req_ids: tuple[str, ...]  # requests in batch order (the order of the rows of compute_logits)
    num_tokens: tuple[int, ...]  # tokens scheduled for each request this step (rows are contiguous per request)
    start_positions: tuple[int, ...]  # position of each request's first scheduled token (= tokens computed before)

    def __post_init__(self) -> None:
        if not (len(self.req_ids) == len(self.num_tokens) == len(self.start_positions)):
            raise ValueError("StepLayout fields must have one entry per request")

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)
