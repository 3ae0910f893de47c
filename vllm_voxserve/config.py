"""The one VoxServe configuration, parsed once from vLLM's ``--additional-config``.

    vllm serve MODEL --plugin voxserve --additional-config '{"voxserve": {"chunk_frames": 10, ...}}'

Components receive the fields they use, never the whole vLLM config. Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

ADDITIONAL_CONFIG_KEY = "voxserve"


class CodecMode(str, enum.Enum):
    """Where the codec runs relative to the backbone (the ablation axis of the paper's §4.7)."""

    INLINE = "inline"  # decode each ready chunk inside the backbone step (time sharing, vLLM-stock-like)
    LANES = "lanes"  # asynchronous urgent + background lanes (the paper's design)


@dataclasses.dataclass(frozen=True, slots=True)
class VoxServeConfig:
    # Audio chunking: the first chunk may be shorter for a fast first audio; later chunks are `chunk_frames` long.
    first_chunk_frames: int = 10
    chunk_frames: int = 10
    # Default streaming SLO; a request may set its own.
    ttfa_slo_ms: float = 200.0
    codec_mode: CodecMode = CodecMode.INLINE
    # Codec state slots (requests whose codec state lives on the device at once).
    max_codec_slots: int = 256
    # Largest number of chunks decoded in one codec batch.
    max_codec_batch: int = 16
    # Codec precision: the exact incremental decode is checked in float32; bfloat16 is faster on GPU.
    codec_dtype: str = "float32"
    # Pure-policy knobs (urgency margin, background batch size, admission ...), validated by the scheduler package.
    scheduler: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Codec lanes (SM split etc.), validated by the codec_lanes package.
    lanes: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("first_chunk_frames", "chunk_frames", "max_codec_slots", "max_codec_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"voxserve.{name} must be a positive integer, got {value!r}")
        if self.ttfa_slo_ms <= 0:
            raise ValueError(f"voxserve.ttfa_slo_ms must be positive, got {self.ttfa_slo_ms!r}")
        if self.codec_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"voxserve.codec_dtype must be float32, bfloat16 or float16, got {self.codec_dtype!r}")

    def chunk_frames_at(self, chunk_index: int) -> int:
        """Frames in the request's chunk number `chunk_index` (0-based)."""
        return self.first_chunk_frames if chunk_index == 0 else self.chunk_frames

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> VoxServeConfig:
        raw = dict(raw or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown voxserve config keys {unknown}; valid keys: {sorted(known)}")
        if "codec_mode" in raw:
            try:
                raw["codec_mode"] = CodecMode(raw["codec_mode"])
            except ValueError:
                valid = [m.value for m in CodecMode]
                raise ValueError(f"voxserve.codec_mode must be one of {valid}, got {raw['codec_mode']!r}") from None
        return cls(**raw)

    @classmethod
    def from_additional_config(cls, additional_config: Mapping[str, Any] | None) -> VoxServeConfig:
        return cls.from_dict((additional_config or {}).get(ADDITIONAL_CONFIG_KEY))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["codec_mode"] = self.codec_mode.value
        return out
