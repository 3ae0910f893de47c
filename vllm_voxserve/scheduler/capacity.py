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

With `first_audio_step_growth` it also fits the host time each decoded row adds to a step (`overhead_per_row_s`:
the steps' time beyond their decode cost against their rows, over about the latest 200 steps), so that a first
audio's steps are predicted at the rows they will carry rather than with the overhead of the rows just seen: on a
slow H100 host the host time of a step went from 2.3 ms at 85 rows to 5.0 ms at 160 (2026-12-06_bd67b01).

It also learns how long a first chunk takes from its cut to its audio leaving the worker (`first_audio_handover_s`,
a high quantile of the latest): the urgent decode, and the wait for the step at which the worker collects it. The
urgent decode's cost alone says about 2 ms; over a whole server start on the H200 the first chunks took p50 15-31 ms,
p90 22-53 ms a 10 s line (2026-12-04_4af55f2, start 2: `first audio ms after cut`), so every prediction of a first
audio came that much early.

Pure: no torch, no vLLM; the clock is the caller's.
"""

from __future__ import annotations

from collections import deque
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


# The hand-over's estimate: this quantile of the latest first audios, recomputed after every few new ones. A burst
# onto an idle server (a benchmark's warm-up, a client's reconnect) hands over slowly; with 64 first audios its
# samples age out within about a second at a hundred arrivals a second (256 would keep predictions late for three).
_HANDOVER_QUANTILE = 0.9
_HANDOVER_SAMPLES = 64
_HANDOVER_REFRESH = 8
# The host time a row adds: fitted over about 1 / _PER_ROW_SMOOTHING steps, once their rows spread by at least
# _PER_ROW_MIN_SPREAD (a standard deviation, in rows), and at most _PER_ROW_MAX_S, so that a few outlying steps (a
# garbage collection, a burst of prefills) cannot lengthen every predicted step.
_PER_ROW_SMOOTHING = 0.005
_PER_ROW_MIN_SPREAD = 4.0
_PER_ROW_MAX_S = 0.0005


class CapacityModel:
    def __init__(self, cfg: SchedulerPolicyConfig, costs: CostModel, smoothing: float = 0.1) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.cfg = cfg
        self.costs = costs
        self.smoothing = smoothing
        self.step_interval_s: float | None = None  # measured time from one LM step to the next (smoothed)
        self.overhead_s = 0.0  # measured step interval beyond the decode cost of its rows (smoothed)
        self._handovers: deque[float] = deque(maxlen=_HANDOVER_SAMPLES)  # the latest first chunks' cut to audio
        self._handover_s: float | None = None
        self._unsorted = 0  # hand-overs since the estimate was computed
        self.rows_mean: float | None = None  # decoded rows of the latest steps, smoothed as `overhead_s` is
        self.overhead_per_row_s = 0.0  # host time a decoded row adds to a step (`first_audio_step_growth`)
        self._fit: tuple[float, float, float, float] | None = None  # smoothed rows, extra, rows², rows × extra

    def observe_first_audio(self, handover_s: float) -> None:
        """A first chunk's audio left the worker `handover_s` after the chunk was cut."""
        if handover_s < 0:
            return
        self._handovers.append(handover_s)
        self._unsorted += 1
        if self._handover_s is None or self._unsorted >= _HANDOVER_REFRESH:
            ranked = sorted(self._handovers)
            self._handover_s = ranked[int(_HANDOVER_QUANTILE * (len(ranked) - 1))]
            self._unsorted = 0

    def first_audio_handover_s(self) -> float:
        """From a first chunk's cut to its audio: as measured, or the urgent decode's cost before any was."""
        return self._handover_s if self._handover_s is not None else self.costs.urgent_codec_s(1)

    def observe_step(self, interval_s: float, rows: int) -> None:
        """One LM step took `interval_s` from its start to the next step's start and decoded `rows` requests."""
        if interval_s < 0:
            return
        old = self.step_interval_s
        self.step_interval_s = interval_s if old is None else old + self.smoothing * (interval_s - old)
        if rows > 0:
            extra = max(interval_s - self.costs.decode_step_s(min(rows, self.cfg.max_decode_batch)), 0.0)
            self.overhead_s += self.smoothing * (extra - self.overhead_s)
            if self.cfg.first_audio_step_growth:
                self._fit_per_row(min(rows, self.cfg.max_decode_batch), extra)

    def _fit_per_row(self, rows: int, extra_s: float) -> None:
        mean = self.rows_mean
        self.rows_mean = float(rows) if mean is None else mean + self.smoothing * (rows - mean)
        sample = (float(rows), extra_s, float(rows * rows), rows * extra_s)
        fit = self._fit
        self._fit = fit = sample if fit is None else tuple(
            old + _PER_ROW_SMOOTHING * (new - old) for old, new in zip(fit, sample))
        x, y, xx, xy = fit
        spread = xx - x * x
        if spread >= _PER_ROW_MIN_SPREAD ** 2:
            self.overhead_per_row_s = min(max((xy - x * y) / spread, 0.0), _PER_ROW_MAX_S)

    def step_s(self, rows: int) -> float:
        """Predicted interval of an LM step that decodes `rows` requests."""
        return self.costs.decode_step_s(min(max(rows, 1), self.cfg.max_decode_batch)) + self.overhead_s

    def first_audio_step_s(self, rows: int) -> float:
        """Predicted interval of a step that decodes `rows` requests, for a first audio's prediction: with
        `first_audio_step_growth`, the overhead at those rows, from the overhead at the latest steps' rows and the
        host time a row adds; otherwise `step_s`."""
        rows = min(max(rows, 1), self.cfg.max_decode_batch)
        if self.rows_mean is None:
            return self.step_s(rows)
        overhead = max(self.overhead_s + self.overhead_per_row_s * (rows - self.rows_mean), 0.0)
        return self.costs.decode_step_s(rows) + overhead

    def backbone_frames_per_s(self) -> float:
        return self.cfg.max_decode_batch / self.step_s(self.cfg.max_decode_batch)

    def codec_frames_per_s(self) -> float:
        batch = self.cfg.background_max_batch
        return batch * self.cfg.chunk_frames / self.costs.background_codec_s(batch)

    def estimate(self) -> CapacityEstimate:
        return CapacityEstimate(self.backbone_frames_per_s(), self.codec_frames_per_s(),
                                self.step_s(self.cfg.max_decode_batch), self.overhead_s)
