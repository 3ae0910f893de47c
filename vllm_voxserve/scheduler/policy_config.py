"""Every tunable of the scheduling policy, in one frozen config.

Times are seconds. Defaults follow the paper (§3.2, §4.1): T = 200 ms, δu = 100 ms, B = 8, prefill deferral of at
most 100 ms in a row, 10-frame chunks of 80 ms frames, the 100/32 SM split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

ADMISSION_MODES = ("deadline_aware", "prefill_first")
OVERLOAD_MODES = ("off", "reject")


@dataclass(frozen=True, slots=True)
class SchedulerPolicyConfig:
    # SLO and playback
    ttfa_target_s: float = 0.2  # T
    frame_duration_s: float = 0.08  # one audio frame (12.5 Hz)
    chunk_frames: int = 10
    first_chunk_frames: int = 10  # a shorter first chunk lowers TTFA
    # codec routing
    urgent_margin_s: float = 0.1  # δu
    background_min_batch: int = 8  # B
    background_max_batch: int = 16  # largest background executable
    urgent_max_batch: int = 8  # largest urgent executable
    early_launch_slack_s: float = 0.1  # launch a small background batch once the earliest chunk has less slack
    # LM lane
    max_decode_batch: int = 64
    max_prefills_per_step: int = 4  # prefill-first: how many waiting requests one step may prefill
    max_prefill_tokens: int = 2048
    max_prefill_deferral_s: float = 0.1
    admission_mode: str = "deadline_aware"
    # overload
    overload_mode: str = "reject"
    backlog_horizon_s: float = 1.0  # admit while the admitted LM work fits in this many seconds
    min_retry_after_s: float = 1.0
    default_expected_frames: int = 100  # when a request's length cannot be estimated (≈ LibriTTS mean)
    # SM split (LM lane SMs / background codec lane SMs); urgent and prefill work use the whole GPU
    lm_sms: int = 100
    codec_sms: int = 32

    def __post_init__(self) -> None:
        _positive(self, "ttfa_target_s", "frame_duration_s", "urgent_margin_s", "backlog_horizon_s")
        _non_negative(self, "early_launch_slack_s", "max_prefill_deferral_s", "min_retry_after_s")
        _at_least_one(
            self, "chunk_frames", "first_chunk_frames", "background_min_batch", "background_max_batch",
            "urgent_max_batch", "max_decode_batch", "max_prefills_per_step", "max_prefill_tokens",
            "default_expected_frames", "lm_sms", "codec_sms",
        )
        if self.background_min_batch > self.background_max_batch:
            raise ValueError(
                f"background_min_batch ({self.background_min_batch}) exceeds background_max_batch "
                f"({self.background_max_batch})"
            )
        if self.admission_mode not in ADMISSION_MODES:
            raise ValueError(f"admission_mode must be one of {ADMISSION_MODES}, got {self.admission_mode!r}")
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
