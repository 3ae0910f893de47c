"""Every tunable of the scheduling policy, in one frozen config.

Times are seconds. Defaults follow the paper (§3.2, §4.1): T = 200 ms, δu = 100 ms, B = 8, prefill deferral of at
most 100 ms in a row, 10-frame chunks of 80 ms frames, the 100/32 SM split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from vllm_voxserve.contract import FRAME_DURATION_S

ADMISSION_MODES = ("deadline_aware", "prefill_first")
OVERLOAD_MODES = ("off", "reject")
COST_SEEDS = ("paper_h100", "h200")


@dataclass(frozen=True, slots=True)
class SchedulerPolicyConfig:
    # SLO and playback
    ttfa_target_s: float = 0.2  # T
    frame_duration_s: float = FRAME_DURATION_S  # one audio frame (12.5 Hz)
    chunk_frames: int = 10
    first_chunk_frames: int = 10  # a shorter first chunk lowers TTFA
    # codec routing
    urgent_margin_s: float = 0.1  # a chunk this close to its deadline goes to the urgent lane
    background_min_batch: int = 8  # smallest background batch launched without urgency
    background_max_batch: int = 64  # largest background executable (codec graphs at powers of two)
    urgent_max_batch: int = 32  # largest urgent executable
    early_launch_slack_s: float = 0.1  # launch a small background batch once the earliest chunk has less slack
    # LM lane

    # The config hook derives the served one from the GPU where the user left it out (serving_defaults.py).
    max_decode_batch: int = 384  # most requests in one decode step (derived from the GPU where unset)
    max_prefills_per_step: int = 8  # waiting requests one prefill may pack (within max_prefill_tokens)
    max_prefill_tokens: int = 2048  # most prompt tokens in one step's prefills
    max_prefill_deferral_s: float = 0.1  # longest a prefill waits for running streams' slack
    admission_mode: str = "deadline_aware"  # "deadline_aware" or "prefill_first"
    # overload
    overload_mode: str = "reject"  # "reject": 503 past capacity; "off": admit everything
    demand_horizons_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)  # windows the frame demand is checked over
    # share of a lane's frame rate (backbone, codec) that admitted streams may need; simulated with H200-shaped costs
    # (benchmarks/simulation), 0.85 let ≈ 5-9 % of admitted requests stall at 1.5-2x capacity, 0.8 under 1 %
    capacity_headroom: float = 0.8  # share of a lane's frame rate admitted streams may need
    # weigh the background codec lane's frame rate at arrival beside the backbone's; off, the backbone's alone (the
    # guard before the codec lane was modelled: past capacity it admitted what the codec lane could not decode)
    codec_admission: bool = True  # weigh the codec lane's frame rate at arrival too
    # bound the requests in progress by a limit learned from the first audio delivered (concurrency_limit.py): the
    # feedback that holds goodput where the cost model overestimates what the server keeps on time
    feedback_limit: bool = True  # bound requests in progress by the first audio delivered
    # the same limit in each API server, learned from the first audio and playback it hands to responses: refuses
    # an arrival at once, before the request is read or reaches the engine (entrypoints/edge_admission.py)
    edge_admission: bool = True  # refuse at the API server past the limit it learns from what it delivers
    limit_floor: int = 16  # the learned limits never go below (a short burst on an idle server is admitted)
    limit_min_late: int = 3  # fewest late first audios in a window that cut a learned limit (one is chance)
    demand_refresh_s: float = 0.05  # how stale the streams' frame demand may be (arrivals in between add theirs)
    # predict a first audio's steps at the rows they will carry (the requests in progress still growing as they did
    # over the last 250 ms) and with the host time each row adds, measured (overload.py, capacity.py); off: at the
    # rows in progress now and one host time a step. Near capacity on a slow host the steps grew from 10.8 ms at 85
    # rows to 18.1 ms at 160 within seconds, and the late first audios were late by 7-18 ms at p50
    # (2026-12-06_bd67b01, H100); off until a GPU measures it beside the defaults
    first_audio_step_growth: bool = False  # predict first audio at the rows and host time its steps will have
    min_retry_after_s: float = 1.0  # smallest Retry-After of a 503
    default_expected_frames: int = 100  # when a request's length cannot be estimated (≈ LibriTTS mean)
    # The cost model's seed, whose shape measured costs scale (costs.py): "paper_h100" (the paper's H100), "h200"
    # (run 2026-12-02_78cd88a's H200; the config hook picks it on large GPUs, serving_defaults.py). The codec lane's
    # capacity is extrapolated along it to full batches before they are measured.
    cost_seed: str = "paper_h100"  # cost model seed: "paper_h100" or "h200" (derived from the GPU)
    # background codec lane SMs (the cost seed's codec line scales with them); urgent and prefill work use the whole GPU
    codec_sms: int = 32

    def __post_init__(self) -> None:
        _positive(self, "ttfa_target_s", "frame_duration_s", "urgent_margin_s")
        _non_negative(self, "early_launch_slack_s", "max_prefill_deferral_s", "min_retry_after_s", "demand_refresh_s")
        _at_least_one(
            self, "chunk_frames", "first_chunk_frames", "background_min_batch", "background_max_batch",
            "urgent_max_batch", "max_decode_batch", "max_prefills_per_step", "max_prefill_tokens",
            "default_expected_frames", "codec_sms", "limit_floor", "limit_min_late",
        )
        if not self.demand_horizons_s or any(not h > 0 for h in self.demand_horizons_s):
            raise ValueError(f"demand_horizons_s must be positive seconds, got {self.demand_horizons_s!r}")
        if not 0 < self.capacity_headroom <= 1:
            raise ValueError(f"capacity_headroom must be in (0, 1], got {self.capacity_headroom!r}")
        if self.background_min_batch > self.background_max_batch:
            raise ValueError(
                f"background_min_batch ({self.background_min_batch}) exceeds background_max_batch "
                f"({self.background_max_batch})"
            )
        if self.admission_mode not in ADMISSION_MODES:
            raise ValueError(f"admission_mode must be one of {ADMISSION_MODES}, got {self.admission_mode!r}")
        for name in ("codec_admission", "feedback_limit", "edge_admission", "first_audio_step_growth"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.cost_seed not in COST_SEEDS:
            raise ValueError(f"cost_seed must be one of {COST_SEEDS}, got {self.cost_seed!r}")
        if self.overload_mode not in OVERLOAD_MODES:
            raise ValueError(f"overload_mode must be one of {OVERLOAD_MODES}, got {self.overload_mode!r}")

    @property
    def deadline_aware(self) -> bool:
        return self.admission_mode == "deadline_aware"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> "SchedulerPolicyConfig":
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown scheduler policy keys: {unknown}")
        if "demand_horizons_s" in values:
            values["demand_horizons_s"] = tuple(float(h) for h in values["demand_horizons_s"])
        return cls(**values)

    def replace(self, **changes: Any) -> "SchedulerPolicyConfig":
        return dataclasses.replace(self, **changes)


def _positive(cfg: SchedulerPolicyConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def _non_negative(cfg: SchedulerPolicyConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def _at_least_one(cfg: SchedulerPolicyConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
