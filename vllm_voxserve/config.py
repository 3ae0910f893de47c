"""The one VoxServeConfig, parsed once per process from vLLM's ``--additional-config`` (`process_config`).

    vllm serve MODEL --plugin voxserve --additional-config '{"voxserve": {"chunk_frames": 10, ...}}'

The `voxserve` section takes the settings (`SETTINGS`) and nothing else. Every other field is derived (from the
settings, the GPU or the model) or internal; internal fields are set only through the `voxserve_internal` section or
`VoxServeConfig.from_tree` (tests, benchmarks, the config hook's derived values). Components receive the fields they
use, never the whole vLLM config. Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig

ADDITIONAL_CONFIG_KEY = "voxserve"
# The section of internal fields: compile and graph switches, the lanes' executable shapes, the policy's constants,
# the cost model's seed. A section of vLLM's additional config rather than an environment variable, so that it
# reaches every process (API server, engine core, workers) with the settings and is part of what `process_config`
# caches on; a section apart from the settings, so that a user's section stays small and each of its errors names a
# setting. Its keys promise nothing between versions.
INTERNAL_CONFIG_KEY = "voxserve_internal"
# What a user may set under `voxserve`, as dotted paths into its sections (the README's table lists them).
SETTINGS = frozenset({
    "first_chunk_frames", "chunk_frames", "ttfa_slo_ms", "codec_mode", "codec_dtype", "max_codec_slots",
    "scheduler.max_decode_batch", "scheduler.overload_mode", "scheduler.capacity_headroom",
    "scheduler.min_retry_after_s", "lanes.split.group_sms", "lanes.backbone_priority", "admin_routes",
    "max_request_bytes", "max_input_chars", "max_instructions_chars", "max_ref_audio_bytes", "max_ref_audio_seconds",
    "voices_dir", "max_voices",
})
_SECTIONS = ("scheduler", "lanes", "lanes.split")  # keys whose value is an object of further keys
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

    group: str = "codec"  # the side group_sms counts: "codec" (the background codec lane) or "lm" (the backbone)
    # The codec bounds capacity once the backbone is fast: on the H200 (132 SMs) 64 codec SMs decoded 6,907 frames/s
    # beside the backbone where 48 decoded 5,250 (benchmarks/fig3, benchmarks/results/).
    group_sms: int = 64  # SMs of the background codec lane (GPU); the backbone keeps the rest

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
    # The urgent lane takes one batch per engine step, so a burst of first chunks larger than its largest batch
    # waited a step for each further batch: 32 requests arriving at once on the H200 got first audio in four groups
    # about a step apart (p50 TTFA 210 ms against 72 ms at 16, 2026-12-04_f021b3d).
    urgent_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # batch sizes of the urgent lane's executables
    # Near capacity on the H200 the background lane ran busy with batches of 56-64.
    background_max_batch: int = 64  # largest background codec batch (its graph sizes: background_bucket_step)
    # A batch pads up to the next graph: 33 chunks ran as 64. In service on the H100 the lane spent 0.095-0.115 ms of
    # device time a frame at mean batches of 23-47, where batches of 16 alone took 0.064 (2026-12-06_bf9a7fa).
    background_bucket_step: int = 0  # graphs at powers of two below it, then at its multiples; 0: powers of two
    # 2 queues the next batch behind the running one, so the codec partition does not idle until the next engine
    # step feeds it.
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
        if self.background_bucket_step != 0 or isinstance(self.background_bucket_step, bool):  # 0: powers of two
            _check_positive_int(f"{self.WHERE}.background_bucket_step", self.background_bucket_step)
        if not isinstance(self.use_graphs, bool):
            raise ValueError(f"{self.WHERE}.use_graphs must be true or false, got {self.use_graphs!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class LanesConfig(LaneExecutables):
    """`voxserve.lanes`: the codec lanes of the `lanes` codec mode (their executables, the SM split) and the
    backbone's stream priority. Pure: the worker builds `codec_lanes.LaneConfig` / `SplitSpec` from it."""

    split: LaneSplitConfig = LaneSplitConfig()
    # The stream priority the backbone's graphs are captured at and its eager work runs at. "least": vLLM's own
    # stream, the background codec lane's priority. "high": above the background lane and below the urgent lane, so
    # the backbone's blocks go first onto any SM that frees up and the codec runs in what the backbone leaves; beside
    # a busy 64-SM codec lane on the H200 a 192-row step took 12.7 ms at "high" and 15.2 at "least"
    # (benchmarks/backbone_priority.py). vLLM releases past 0.26 capture graphs without the stream hook: "least".
    backbone_priority: str = "high"  # CUDA stream priority of the backbone: "high" or "least" (GPU)

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
    """Every field, settings and internal alike. Built from a user's input by `from_dict` (settings only, plus the
    internal section), elsewhere by `from_tree` or the constructor (tests, benchmarks)."""

    # Audio chunking: the first chunk may be shorter for a fast first audio; later chunks are `chunk_frames` long.
    first_chunk_frames: int = 5  # frames in a stream's first chunk (80 ms a frame)
    chunk_frames: int = 10  # frames in each later chunk
    ttfa_slo_ms: float = 200.0  # first-audio target T in ms; a request may set its own
    codec_mode: CodecMode = CodecMode.AUTO  # "auto" (lanes on a GPU, inline on CPU), "lanes" or "inline"
    # Codec state slots: the running streams plus those whose last chunks are still decoding. Where unset, the config
    # hook derives them from the GPU (serving_defaults.py).
    max_codec_slots: int = 512  # codec state slots on the device (derived from the GPU where unset)
    max_codec_batch: int = 16  # most chunks in one inline codec batch
    # "auto" is bfloat16 on a GPU (measured there) and float32 on CPU (where the exact incremental decode is checked;
    # bf16 on CPU stays within its rounding, tests/codec_lanes/test_qwen3_codec_program.py).
    codec_dtype: str = "auto"  # codec precision: "auto" (bf16 on GPU, fp32 on CPU), "bfloat16", "float16", "float32"
    # The served code predictor on GPU: torch.compile its frame, and replay it from CUDA graphs per batch bucket
    # in the steps vLLM does not capture whole (both ignored on CPU).
    code_predictor_compile: bool = True  # torch.compile the code predictor's frame (GPU)
    code_predictor_graphs: bool = True  # replay that frame from CUDA graphs (GPU)
    # The plugin's Triton kernels in the code predictor's frame (models/qwen3_tts/cp_kernels.py): each layer pass's
    # attention as one kernel instead of about seven, each sampling step's top candidates as one sorting kernel
    # (benchmarks/code_predictor_step.py times them).
    code_predictor_kernels: bool = True  # the plugin's Triton kernels in that frame (GPU)
    # A compile at start-up for each chunk length, every batch size >= 2 (codec_program.py); on the H200 it roughly
    # halves a 10-frame chunk's decode (benchmarks/codec_step.py).
    codec_compile: bool = True  # torch.compile the codec (GPU)
    # The fields of `scheduler.SchedulerPolicyConfig` (admission, overload, batch sizes ...), validated at start-up.
    scheduler: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Codec lanes of the `lanes` codec mode (executables' frame counts and batch sizes, SM split): `LanesConfig`;
    # a mapping given here is parsed into one. Its frame_counts must hold both chunk sizes (the default does).
    lanes: LanesConfig = LanesConfig()
    # Off, they answer 404; on, they take the API key (`--api-key` / VLLM_API_KEY) whenever one is set, and only
    # JSON bodies.
    admin_routes: bool = False  # serve GET /voxserve/modes and POST /voxserve/mode (live codec-mode switches)
    # Each limit is refused with a 4xx naming what is over (a 30 s clip at 48 kHz, stereo, float32 is 11.5 MB).
    max_request_bytes: int = 24 << 20  # largest request body (checked before it is read)
    max_input_chars: int = 4096  # longest `input` and `ref_text`
    max_instructions_chars: int = 4096  # longest `instructions`
    max_ref_audio_bytes: int = 16 << 20  # largest decoded `ref_audio` file
    max_ref_audio_seconds: float = 30.0  # longest `ref_audio` clip
    voices_dir: str = ""  # folder uploaded voices are kept in across restarts ("": uploads off)
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
        if isinstance(self.ttfa_slo_ms, bool) or not isinstance(self.ttfa_slo_ms, (int, float)) \
                or not self.ttfa_slo_ms > 0:
            raise ValueError(f"voxserve.ttfa_slo_ms must be a positive number, got {self.ttfa_slo_ms!r}")
        if self.codec_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"voxserve.codec_dtype must be auto, float32, bfloat16 or float16, "
                             f"got {self.codec_dtype!r}")
        if not isinstance(self.codec_mode, CodecMode):
            try:
                object.__setattr__(self, "codec_mode", CodecMode(self.codec_mode))
            except ValueError:
                raise ValueError(f"voxserve.codec_mode must be one of {[m.value for m in CodecMode]}, "
                                 f"got {self.codec_mode!r}") from None
        self._resolve_lanes()
        self.scheduler_policy()  # bad scheduler keys or values fail at start-up

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
        if not isinstance(self.scheduler, Mapping):
            raise ValueError(f"voxserve.scheduler must be an object, got {self.scheduler!r}")
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
    def from_dict(cls, settings: Mapping[str, Any] | None,
                  internal: Mapping[str, Any] | None = None) -> VoxServeConfig:
        """A user's `voxserve` section, which may set only `SETTINGS`, with the `voxserve_internal` section, which
        may set only the other fields: an unknown key, or one in the wrong section, fails naming it."""
        settings, internal = _section(ADDITIONAL_CONFIG_KEY, settings), _section(INTERNAL_CONFIG_KEY, internal)
        _check_keys(ADDITIONAL_CONFIG_KEY, settings, internal=False)
        _check_keys(INTERNAL_CONFIG_KEY, internal, internal=True)
        return cls(**_merge(internal, settings))

    @classmethod
    def from_tree(cls, tree: Mapping[str, Any] | None) -> VoxServeConfig:
        """Any field, a setting or not, from one nested mapping: for tests and benchmarks, never a user's input."""
        return cls.from_dict(*split_tree(_section(ADDITIONAL_CONFIG_KEY, tree)))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["codec_mode"] = self.codec_mode.value
        return out


def _section(where: str, raw: Any) -> dict[str, Any]:
    if raw is not None and not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object, got {raw!r}")
    return dict(raw or {})


def _dotted_keys(where: str, raw: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The keys of a section as dotted paths, those inside its sections (`scheduler`, `lanes`, `lanes.split`) too."""
    keys = []
    for key, value in raw.items():
        path = prefix + str(key)
        if path not in _SECTIONS:
            keys.append(path)
        elif isinstance(value, Mapping):
            keys += _dotted_keys(where, value, path + ".")
        else:
            raise ValueError(f"{where}.{path} must be an object, got {value!r}")
    return keys


def field_keys() -> frozenset[str]:
    """Every field a config may be given, as a dotted path: the settings and the internal fields (not the policy's
    fields that the top level sets or that follow from the rest, which `scheduler_policy` refuses)."""
    def names(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> set[str]:
        return {prefix + f.name for f in dataclasses.fields(cls) if f.name not in skip}

    policy_skip = _POLICY_FROM_TOP_LEVEL + tuple(_POLICY_DERIVED)
    return frozenset(names(VoxServeConfig, "", ("scheduler", "lanes")) | names(LanesConfig, "lanes.", ("split",))
                     | names(LaneSplitConfig, "lanes.split.") | names(SchedulerPolicyConfig, "scheduler.", policy_skip))


def _check_keys(where: str, raw: Mapping[str, Any], internal: bool) -> None:
    keys = set(_dotted_keys(where, raw))
    # the policy's mirrored and derived fields pass here: `scheduler_policy` refuses them naming where each comes from
    keys -= {f"scheduler.{name}" for name in (*_POLICY_FROM_TOP_LEVEL, *_POLICY_DERIVED)}
    unknown = sorted(keys - field_keys())
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown}; the settings: {sorted(SETTINGS)}")
    if internal and keys & SETTINGS:
        raise ValueError(f"{where} keys {sorted(keys & SETTINGS)} are settings: give them under "
                         f"{ADDITIONAL_CONFIG_KEY}")
    if not internal and keys - SETTINGS:
        raise ValueError(f"{where} keys {sorted(keys - SETTINGS)} are internal (derived, or fixed for serving), not "
                         f"settings; the settings: {sorted(SETTINGS)}")


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def split_tree(tree: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings, internal): a nested mapping of any fields parted into the `voxserve` and `voxserve_internal`
    sections (sections that end up empty are left out)."""
    settings, internal = {}, {}
    for key, value in tree.items():
        path = prefix + str(key)
        if path in _SECTIONS and isinstance(value, Mapping):
            for part, section in zip(split_tree(value, path + "."), (settings, internal)):
                if part:
                    section[key] = part
        elif path in SETTINGS:
            settings[key] = value
        else:
            internal[key] = value
    return settings, internal


def as_additional_config(tree: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's additional config holding a nested mapping of any fields: for tests and benchmarks that set internal
    fields on a served config."""
    settings, internal = split_tree(tree)
    return {ADDITIONAL_CONFIG_KEY: settings, INTERNAL_CONFIG_KEY: internal}


_PARSED: dict[str, VoxServeConfig] = {}


def process_config(additional_config: Mapping[str, Any] | None) -> VoxServeConfig:
    """This process's one config: parsed at the first call, the same frozen object at every later one.

    Each process (API server, engine core, worker) holds vLLM's additional config, and vLLM builds some of our
    objects itself, handing them only its own config (the scheduler, the model, Model Runner V2's model state): each
    asks here and gets the object the process's entry point parsed. Sections the config hook has since extended
    (serving defaults, API-server process) are a new config and parse once more."""
    additional = additional_config or {}
    settings, internal = additional.get(ADDITIONAL_CONFIG_KEY), additional.get(INTERNAL_CONFIG_KEY)
    key = json.dumps([settings, internal], sort_keys=True, default=str)
    config = _PARSED.get(key)
    if config is None:
        config = _PARSED[key] = VoxServeConfig.from_dict(settings, internal)
    return config
