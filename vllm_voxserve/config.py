"""The one VoxServe configuration, parsed once per process from vLLM's ``--additional-config`` (`process_config`).

    vllm serve MODEL --plugin voxserve --additional-config '{"voxserve": {"chunk_frames": 10, ...}}'

Components receive the fields they use, never the whole vLLM config. Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

ADDITIONAL_CONFIG_KEY = "voxserve"
# Policy fields that mirror top-level voxserve fields: one place to set each (see `scheduler_policy`).
_POLICY_FROM_TOP_LEVEL = ("ttfa_target_s", "first_chunk_frames", "chunk_frames")
# Policy fields derived from the rest of the config or from the model, never set in `voxserve.scheduler`: where each
# comes from.
_POLICY_DERIVED = {
    "frame_duration_s": "the codec's frame rate",
    "background_max_batch": "voxserve.lanes.background_max_batch",
    "urgent_max_batch": "voxserve.lanes.urgent_buckets",
    "codec_sms": "voxserve.lanes.split",
}


class CodecMode(str, enum.Enum):
    """Where the codec runs relative to the backbone (the ablation axis of the paper's §4.7)."""

    INLINE = "inline"  # decode each ready chunk inside the backbone step (time sharing, vLLM-stock-like)
    LANES = "lanes"  # asynchronous urgent + background lanes (the paper's design)
    AUTO = "auto"  # the configured default: lanes on a GPU (inline if its SM partitions cannot be made), inline on CPU


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _reject_unknown(where: str, raw: Mapping[str, Any], cls: type) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown}; valid keys: {sorted(known)}")


BACKBONE_PRIORITIES = ("least", "high")


def backbone_stream_priority(setting: str, least: int, greatest: int) -> int:
    """The stream priority of `lanes.backbone_priority` in the device's range (CUDA: a lower number goes first;
    `least` is the default streams' and the background lane's, `greatest` the urgent lane's): "high" is one level
    above the least, or the greatest where the range has only two levels."""
    if setting not in BACKBONE_PRIORITIES:
        raise ValueError(f"unknown backbone priority {setting!r}")
    if setting == "least" or least == greatest:
        return least
    return least - 1


@dataclasses.dataclass(frozen=True, slots=True)
class LaneSplitConfig:
    """`voxserve.lanes.split`: the GPU's SM split (`codec_lanes.SplitSpec` without the device). The side named by
    `group` gets `group_sms` SMs, the other side the rest. Unused on CPU."""

    group: str = "codec"  # "codec" or "lm"
    # Figure 3's split chooser picks 64 codec SMs on the H200 since the code predictor got faster (runs
    # 2026-11-30_5a7f644 and 2026-11-30_cf01941,
    # benchmarks/results/h200/): the codec bounds capacity, and 48 req/s of the LibriTTS workload needs about 4,700
    # codec frames/s, where 48 SMs beside the backbone gave 5,250 and 64 gave 6,907. Served with 64, 48 req/s met
    # the SLO for 98 % and 93 % of requests (two runs); the 48-SM server of the same run hung before it was
    # probed there (the stale stream count fixed in the scheduler adapter), so the served A/B is still to run.
    group_sms: int = 64  # SMs of the split's `group` side (64 of 132 on the H200)

    def __post_init__(self) -> None:
        if self.group not in ("codec", "lm"):
            raise ValueError(f"voxserve.lanes.split.group must be 'codec' or 'lm', got {self.group!r}")
        _check_positive_int("voxserve.lanes.split.group_sms", self.group_sms)


@dataclasses.dataclass(frozen=True, slots=True)
class LaneExecutables:
    """The codec lanes' executables: what `LanesConfig` (adding the SM split and the backbone's priority) and
    `codec_lanes.LaneConfig` (adding the slot count, `voxserve.max_codec_slots`) share."""

    # the section named in errors
    WHERE: ClassVar[str] = "voxserve.lanes"

    frame_counts: tuple[int, ...] = ()  # chunk lengths with executables; () means the configured chunk sizes
    urgent_buckets: tuple[int, ...] = (1, 2, 4, 8)  # batch sizes of the urgent lane's executables
    # largest background batch (executables at powers of two up to it): at 80-96 req/s on the H200 the background
    # lane was busy 100 % with batches of 56-64 (run 2026-12-01_2a42666)
    background_max_batch: int = 64  # largest background codec batch (graphs at powers of two)
    # background batches in flight at once, each with its own executables: 2 queues the next behind the running one,
    # so the codec partition does not idle until the next engine step feeds it
    background_depth: int = 2  # background batches in flight at once
    use_graphs: bool = True  # CUDA graphs per (bucket, frames); ignored on CPU

    def __post_init__(self) -> None:
        for name in ("frame_counts", "urgent_buckets"):
            values = getattr(self, name)
            if not isinstance(values, tuple):
                raise ValueError(f"{self.WHERE}.{name} must be a list of positive integers, got {values!r}")
            for value in values:
                _check_positive_int(f"{self.WHERE}.{name}", value)
        if not self.urgent_buckets:
            raise ValueError(f"{self.WHERE}.urgent_buckets must not be empty")
        _check_positive_int(f"{self.WHERE}.background_max_batch", self.background_max_batch)
        _check_positive_int(f"{self.WHERE}.background_depth", self.background_depth)
        if not isinstance(self.use_graphs, bool):
            raise ValueError(f"{self.WHERE}.use_graphs must be true or false, got {self.use_graphs!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class LanesConfig(LaneExecutables):
    """`voxserve.lanes`: the codec lanes of the `lanes` codec mode (their executables, the SM split) and the
    backbone's stream priority. Pure: the worker builds `codec_lanes.LaneConfig` / `SplitSpec` from it."""

    split: LaneSplitConfig = LaneSplitConfig()
    # The stream priority the backbone's graphs are captured at and its eager work runs at (GPU). "least": vLLM's
    # own stream, the background codec lane's priority: an SM that frees up takes a pending block of either. "high"
    # (default): above the background lane, below the urgent lane, so the backbone's blocks go first onto any SM
    # that frees up (the codec partition's too) and the codec runs in what the backbone leaves. On the H200 beside a
    # busy 64-SM codec lane (run 2026-12-02_78cd88a, batch 192, benchmarks.backbone_priority): a step 15.2 ms at
    # "least", 12.7
    # at "high" (9.5 alone), the codec's 64 x 10-frame batch 32.0 and 45.6 ms; served with it, `lanes` met 99.73 %
    # at 120 req/s. Set at start-up.
    backbone_priority: str = "high"  # CUDA stream priority of the backbone (GPU)

    def __post_init__(self) -> None:
        LaneExecutables.__post_init__(self)  # (zero-argument super() fails in a slots dataclass)
        if self.backbone_priority not in BACKBONE_PRIORITIES:
            raise ValueError(f"voxserve.lanes.backbone_priority must be one of {list(BACKBONE_PRIORITIES)}, got "
                             f"{self.backbone_priority!r}")
        if not isinstance(self.split, LaneSplitConfig):
            raise ValueError(f"voxserve.lanes.split must be an object, got {self.split!r}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> LanesConfig:
        if raw is not None and not isinstance(raw, Mapping):
            raise ValueError(f"voxserve.lanes must be an object, got {raw!r}")
        raw = dict(raw or {})
        if "max_requests" in raw:
            raise ValueError("voxserve.lanes.max_requests is not a key: the lanes have voxserve.max_codec_slots slots")
        _reject_unknown("voxserve.lanes", raw, cls)
        for name in ("frame_counts", "urgent_buckets"):
            if isinstance(raw.get(name), list):
                raw[name] = tuple(raw[name])
        split = raw.get("split")
        if split is not None and not isinstance(split, LaneSplitConfig):
            if not isinstance(split, Mapping):
                raise ValueError(f"voxserve.lanes.split must be an object, got {split!r}")
            _reject_unknown("voxserve.lanes.split", split, LaneSplitConfig)
            raw["split"] = LaneSplitConfig(**split)
        return cls(**raw)


@dataclasses.dataclass(frozen=True, slots=True)
class VoxServeConfig:
    # Audio chunking: the first chunk may be shorter for a fast first audio; later chunks are `chunk_frames` long.
    first_chunk_frames: int = 5  # frames in a stream's first chunk (80 ms each)
    chunk_frames: int = 10  # frames in each later chunk
    # Default streaming SLO; a request may set its own.
    ttfa_slo_ms: float = 200.0  # first-audio target T; a request may set its own
    codec_mode: CodecMode = CodecMode.AUTO  # "auto" (lanes on GPU, inline on CPU), "lanes" or "inline"
    # Codec state slots (requests whose codec state lives on the device at once): the running streams plus those
    # whose last chunks are still decoding. The config hook derives the served number from the GPU
    # (serving_defaults.py); 512 beside 384 decode rows is what the H200 served 120 req/s with (run 2026-12-02_78cd88a).
    max_codec_slots: int = 512  # codec state slots on the device (derived from the GPU)
    # Largest number of chunks decoded in one codec batch.
    max_codec_batch: int = 16  # most chunks in one inline codec batch
    # Codec precision: "auto" is bfloat16 on GPU (measured there) and float32 on CPU (where the exact incremental
    # decode is checked). torch 2.11's CPU bf16 conv1d is 42 % off for a 1x1 conv over exactly 5 frames; the codec's
    # one such conv (the quantizer's projection) runs as a matmul since run 2026-11-30_cf01941, and bf16 on CPU stays
    # within its rounding (tests/codec_lanes/test_qwen3_codec_program.py).
    codec_dtype: str = "auto"  # "auto": bf16 on GPU, fp32 on CPU
    # The served code predictor on GPU: torch.compile its frame, and replay it from CUDA graphs per batch bucket
    # in the steps vLLM does not capture whole (both ignored on CPU).
    code_predictor_compile: bool = True  # torch.compile the code predictor's frame (GPU)
    code_predictor_graphs: bool = True  # replay that frame from CUDA graphs (GPU)
    # Our Triton kernels in the code predictor's frame on GPU (models/qwen3_tts/cp_kernels.py): each layer pass's
    # attention as one kernel instead of about seven, each sampling step's top candidates as one sorting kernel
    # instead of torch.topk's two. H200, compiled frame in a CUDA graph: 4.15 -> 3.87 ms at batch 2, 5.05 -> 4.17 ms
    # at 64, 5.43 -> 5.07 ms at 128 (benchmarks/code_predictor_step.py, results/h200/2026-11-30_5a7f644).
    code_predictor_kernels: bool = True  # the plugin's Triton kernels in that frame (GPU)
    # torch.compile the codec decoder inside its executables, on GPU (ignored on CPU): a compile at start-up for
    # each chunk length, every batch size >= 2 (codec_program.py). H200, 10-frame chunks, bf16 graphs: 1 chunk 3.4
    # -> 1.8 ms, 16 chunks 15.8 -> 9.8 ms on the whole GPU (benchmarks/codec_step.py)
    codec_compile: bool = True  # torch.compile the codec (GPU)
    # Pure-policy knobs (admission_mode "deadline_aware" | "prefill_first", overload_mode "reject" | "off", urgency
    # margin, batch sizes ...): the fields of `scheduler.SchedulerPolicyConfig`, validated at start-up.
    scheduler: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Codec lanes of the `lanes` codec mode (executables' frame counts and batch sizes, SM split): `LanesConfig`;
    # a mapping given here is parsed into one. Its frame_counts must hold both chunk sizes (the default does).
    lanes: LanesConfig = LanesConfig()
    # `GET /voxserve/modes` and `POST /voxserve/mode` (live mode switches, for benchmarks): off answers 404; on, they
    # take the API key (`--api-key` / VLLM_API_KEY) whenever one is set, and only JSON bodies.
    admin_routes: bool = False  # serve the /voxserve/* mode-switch routes
    # Request limits of the HTTP API, each refused with a 4xx naming what is over: the body's bytes (checked before
    # it is read), `input` and `ref_text` characters, `instructions` characters, and the reference clip's decoded
    # file bytes and seconds (a 30 s clip at 48 kHz, stereo, float32 is 11.5 MB).
    max_request_bytes: int = 24 << 20  # largest request body
    max_input_chars: int = 4096  # longest `input` and `ref_text`
    max_instructions_chars: int = 4096  # longest `instructions`
    max_ref_audio_bytes: int = 16 << 20  # largest decoded `ref_audio` file
    max_ref_audio_seconds: float = 30.0  # longest `ref_audio` clip
    # Uploaded voices of a Base checkpoint (`POST /v1/audio/voices`): the folder they are kept in across restarts
    # ("" turns uploads off) and how many it may hold.
    voices_dir: str = ""  # folder of uploaded voices ("": uploads off)
    max_voices: int = 64  # most uploaded voices kept

    def __post_init__(self) -> None:
        for name in ("first_chunk_frames", "chunk_frames", "max_codec_slots", "max_codec_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"voxserve.{name} must be a positive integer, got {value!r}")
        for name in ("max_request_bytes", "max_input_chars", "max_instructions_chars", "max_ref_audio_bytes",
                     "max_voices"):
            _check_positive_int(f"voxserve.{name}", getattr(self, name))
        seconds = self.max_ref_audio_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
            raise ValueError(f"voxserve.max_ref_audio_seconds must be a number in (0, 3600], got {seconds!r}")
        if not isinstance(self.voices_dir, str):
            raise ValueError(f"voxserve.voices_dir must be a folder path (a string), got {self.voices_dir!r}")
        for name in ("admin_routes", "code_predictor_compile", "code_predictor_graphs", "code_predictor_kernels",
                     "codec_compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"voxserve.{name} must be true or false, got {getattr(self, name)!r}")
        if self.ttfa_slo_ms <= 0:
            raise ValueError(f"voxserve.ttfa_slo_ms must be positive, got {self.ttfa_slo_ms!r}")
        if self.codec_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"voxserve.codec_dtype must be auto, float32, bfloat16 or float16, "
                             f"got {self.codec_dtype!r}")
        self._resolve_lanes()
        self.scheduler_policy()  # bad scheduler keys or values fail at start-up
        if not isinstance(self.codec_mode, CodecMode):
            object.__setattr__(self, "codec_mode", CodecMode(self.codec_mode))

    def _resolve_lanes(self) -> None:
        lanes = self.lanes if isinstance(self.lanes, LanesConfig) else LanesConfig.from_dict(self.lanes)
        chunk_sizes = {self.first_chunk_frames, self.chunk_frames}
        if not lanes.frame_counts:
            lanes = dataclasses.replace(lanes, frame_counts=tuple(sorted(chunk_sizes)))
        elif not chunk_sizes <= set(lanes.frame_counts):
            raise ValueError(f"voxserve.lanes.frame_counts {list(lanes.frame_counts)} must contain the chunk sizes "
                             f"{sorted(chunk_sizes)} (first_chunk_frames, chunk_frames)")
        object.__setattr__(self, "lanes", lanes)  # frozen: settle the parsed value once

    def scheduler_policy(self) -> SchedulerPolicyConfig:
        """The scheduling policy: `scheduler` plus the SLO and chunking set at the top level (the server-default
        SLO `ttfa_slo_ms` is the policy's T; a request's own `ttfa_slo_ms` overrides it for that request)."""
        raw = dict(self.scheduler)
        duplicated = sorted(set(raw) & set(_POLICY_FROM_TOP_LEVEL))
        if duplicated:
            raise ValueError(f"voxserve.scheduler must not set {duplicated}: use voxserve.ttfa_slo_ms, "
                             "voxserve.first_chunk_frames and voxserve.chunk_frames")
        for key in sorted(set(raw) & set(_POLICY_DERIVED)):
            raise ValueError(f"voxserve.scheduler must not set {key!r}: it follows {_POLICY_DERIVED[key]}")
        raw.update(ttfa_target_s=self.ttfa_slo_ms / 1000.0, first_chunk_frames=self.first_chunk_frames,
                   chunk_frames=self.chunk_frames)
        if self.lanes.split.group == "codec":  # the cost model's seed scales the codec by its SMs: the same split
            raw["codec_sms"] = self.lanes.split.group_sms
        # the policy plans batches up to the lanes' largest executables (a larger plan is cut to them, a smaller
        # one leaves them unused)
        raw.update(background_max_batch=self.lanes.background_max_batch,
                   urgent_max_batch=max(self.lanes.urgent_buckets))
        try:
            return SchedulerPolicyConfig.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"voxserve.scheduler: {exc}") from None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> VoxServeConfig:
        raw = dict(raw or {})
        _reject_unknown("voxserve", raw, cls)
        if "codec_mode" in raw:
            try:
                raw["codec_mode"] = CodecMode(raw["codec_mode"])
            except ValueError:
                valid = [m.value for m in CodecMode]
                raise ValueError(f"voxserve.codec_mode must be one of {valid}, got {raw['codec_mode']!r}") from None
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["codec_mode"] = self.codec_mode.value
        return out


_PARSED: dict[str, VoxServeConfig] = {}


def process_config(additional_config: Mapping[str, Any] | None) -> VoxServeConfig:
    """This process's one config: parsed at the first call, the same frozen object at every later one.

    Each process (API server, engine core, worker) holds vLLM's additional config, and vLLM builds some of our
    objects itself, handing them only its own config (the scheduler, the model, Model Runner V2's model state): each
    asks here and gets the object the process's entry point parsed. A section the config hook has since extended
    (serving defaults, API-server process) is a new config and parses once more."""
    section = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    key = json.dumps(section, sort_keys=True, default=str)
    config = _PARSED.get(key)
    if config is None:
        config = _PARSED[key] = VoxServeConfig.from_dict(section)
    return config
