"""When the background codec lane launches, and with which chunks (paper §3.2, "background batching within slack").

Launch once at least B background chunks are ready, in deadline order up to the largest executable. Launch a smaller
batch early when the earliest deadline approaches (its slack after the batch would fall below δu plus a lead) or
when the LM has nothing left to generate (no more chunks will come to fill the batch). Otherwise wait: an idle codec
partition costs little, since the backbone keeps almost all its speed on its own partition.
"""

from __future__ import annotations

from typing import Sequence

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.urgency import ReadyChunk, by_deadline


def background_batch(
    candidates: Sequence[ReadyChunk],
    now: float,
    lm_has_work: bool,
    costs: CostModel,
    cfg: SchedulerPolicyConfig,
) -> list[ReadyChunk]:
    """The batch to launch now on an idle background lane, or [] to keep waiting."""
    if not candidates:
        return []
    batch = by_deadline(candidates)[: cfg.background_max_batch]
    if len(candidates) >= cfg.background_min_batch or not lm_has_work:
        return batch
    slack_after = batch[0].deadline - now - costs.background_codec_s(len(batch))
    if slack_after < cfg.urgent_margin_s + cfg.early_launch_slack_s:
        return batch
    return []
