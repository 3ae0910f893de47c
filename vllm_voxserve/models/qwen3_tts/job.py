"""One speech request as the API server hands it to the worker, inside vLLM's `SamplingParams.extra_args`.

vLLM carries `extra_args` (msgpack) from the API server to the engine and the worker untouched. The prompt travels
as the pure `SpeechPrompt` (token ids, speaker, language ...): the worker rebuilds the same plan and embeds it,
and vLLM itself only sees placeholder prompt ids of the plan's length (text ids would overflow the codec
vocabulary that vLLM's penalties index).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_voxserve.contract import JOB_KEY

from .prompt import SpeechPrompt


# The served code predictor samples among this many top logits (`fused_code_predictor`), so a sampled request's
# code-predictor top_k must lie in 1..MAX_CODE_PREDICTOR_TOP_K (the official default is 50).
MAX_CODE_PREDICTOR_TOP_K = 64


@dataclass(frozen=True)
class CodePredictorSampling:
    """Sampling of codebooks 1..15 (the official `subtalker_*` settings); temperature <= 0 means greedy."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0


@dataclass(frozen=True)
class TalkerSampling:
    """Sampling of codebook 0 (the talker's own settings, as vLLM's `SamplingParams` carry them); the worker draws it
    with the request's counter noise, so a seeded request's codes do not depend on its batch."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05


@dataclass(frozen=True)
class SpeechJob:
    stream_key: str
    audio_address: str
    prompt: SpeechPrompt
    ref_audio: bytes = b""  # float32 mono 24 kHz reference clip (Base voice cloning), until the API server encodes it
    x_vector: bytes = b""  # float32 [hidden]: the clip's speaker embedding, what the worker receives (Base)
    ref_codes: bytes = b""  # int32 [frames, 16]: the clip's codec codes (ICL cloning; empty for x-vector only)
    fixed_length: bool = False  # EOS is never sampled: the request runs to max_tokens (benchmarks, random weights)
    seed: int | None = None
    code_predictor: CodePredictorSampling = field(default_factory=CodePredictorSampling)
    talker: TalkerSampling = field(default_factory=TalkerSampling)
    ttfa_slo_ms: float | None = None  # None: the server default
    # The target text grows after the request starts (streaming text in): `prompt.text_ids` holds what had arrived,
    # the rest comes through `contract.TEXT_RPC_METHOD`, and tts_eos only once the text has ended.
    text_stream: bool = False

    def to_extra_args(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["prompt"]["text_ids"] = list(self.prompt.text_ids)
        payload["prompt"]["instruct_ids"] = list(self.prompt.instruct_ids)
        payload["prompt"]["ref_text_ids"] = list(self.prompt.ref_text_ids)
        return {JOB_KEY: payload}

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> SpeechJob:
        if not extra_args or JOB_KEY not in extra_args:
            raise ValueError("request carries no voxserve job: send speech requests through /v1/audio/speech")
        raw = dict(extra_args[JOB_KEY])
        prompt = dict(raw.pop("prompt"))
        for name in ("text_ids", "instruct_ids", "ref_text_ids"):
            prompt[name] = tuple(prompt.get(name) or ())
        raw["code_predictor"] = CodePredictorSampling(**raw.get("code_predictor", {}))
        raw["talker"] = TalkerSampling(**raw.get("talker", {}))
        return cls(prompt=SpeechPrompt(**prompt), **raw)
