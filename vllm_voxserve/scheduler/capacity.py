"""What the server can deliver, in audio frames per second, per lane: the backbone and the background codec lane.

Both numbers come from the cost model (seeded, corrected online by measured device times, `costs.CostModel`) and
from the measured interval between LM steps:

- backbone: a full decode batch (`max_decode_batch` rows) per step, a step being the decode step's cost at that
  batch plus the `overhead_s` the steps take beyond their decode cost (host time between steps, packed prefills,
  urgent codec calls on the whole GPU), learned from each step's interval and its decode rows. Judging by the
  interval at the current batch instead underestimates the step at a full batch while load rises (the step grows
  with the batch), and judging by the cost at a full batch alone misses the host time.
- codec: full background batches (`background_max_batch` chunks of `chunk_frames`) back to back on the codec
  partition. First chunks go to the urgent lane, whose frames are not counted against it.

Pure: no torch, no vLLM; the clock is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    backbone_frames_per_s: float
    codec_frames_per_s: float
    step_s: float  # a full decode batch's step, overhead included
    overhead_s: float

    @property
    def frames_per_s(self) -> float:
        return min(self.backbone_frames_per_s, self.codec_frames_per_s)

    @property
    def bound_by(self) -> str:
        return "codec" if self.codec_frames_per_s < self.backbone_frames_per_s else "backbone"


class CapacityModel:
    def __init__(self, cfg: SchedulerPolicyConfig, costs: CostModel, smoothing: float = 0.1) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.cfg = cfg
        self.costs = costs
        self.smoothing = smoothing
        self.step_interval_s: float | None = None  # measured time from one LM step to the next (smoothed)
        self.overhead_s = 0.0  # measured step interval beyond the decode cost of its rows (smoothed)

    def observe_step(self, interval_s: float, rows: int) -> None:
        """One LM step took `interval_s` from its start to the next step's start and decoded `rows` requests."""
        if interval_s < 0:
            return
        old = self.step_interval_s
        self.step_interval_s = interval_s if old is None else old + self.smoothing * (interval_s - old)
        if rows > 0:
            extra = max(interval_s - self.costs.decode_step_s(min(rows, self.cfg.max_decode_batch)), 0.0)
            self.overhead_s += self.smoothing * (extra - self.overhead_s)

    def step_s(self, rows: int) -> float:
        """Predicted interval of an LM step that decodes `rows` requests."""
        return self.costs.decode_step_s(min(max(rows, 1), self.cfg.max_decode_batch)) + self.overhead_s

    def backbone_frames_per_s(self) -> float:
        return self.cfg.max_decode_batch / self.step_s(self.cfg.max_decode_batch)

    def codec_frames_per_s(self) -> float:
        batch = self.cfg.background_max_batch
        return batch * self.cfg.chunk_frames / self.costs.background_codec_s(batch)

    def estimate(self) -> CapacityEstimate:
        return CapacityEstimate(self.backbone_frames_per_s(), self.codec_frames_per_s(),
                                self.step_s(self.cfg.max_decode_batch), self.overhead_s)
