"""The body of `POST /v1/audio/speech`: OpenAI's fields, Qwen3-TTS's fields, and fields for tests and benchmarks.

Validation here raises `ValueError` with a message meant for the client (the route turns it into HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MAX_INPUT_CHARS = 4096
RESPONSE_FORMATS = ("wav", "pcm")
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # OpenAI
    model: str | None = None
    input: str
    voice: str | None = None
    response_format: str = "wav"
    speed: float = 1.0
    stream: bool = False
    stream_format: str | None = None  # OpenAI's: "audio" streams raw audio (as stream=true); "sse" is unsupported
    instructions: str | None = None
    # Qwen3-TTS
    task_type: str | None = None  # CustomVoice | VoiceDesign | Base; must match the served checkpoint
    language: str = "auto"
    ref_audio: str | None = None  # base64 or data URL of a 24 kHz clip (Base voice cloning)
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    non_streaming_mode: bool | None = None  # text fed all at once (True) or one token per frame (False)
    # sampling (defaults are the checkpoint's generation_config.json)
    temperature: float | None = Field(default=None, ge=0.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    subtalker_temperature: float | None = Field(default=None, ge=0.0)
    subtalker_top_k: int | None = Field(default=None, ge=0)
    subtalker_top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    # length control: N tokens give N-1 frames of 80 ms (the last sampled token never becomes audio)
    max_new_tokens: int = Field(default=2048, ge=2, le=16384)
    ignore_eos: bool = False  # run to max_new_tokens (fixed length; random-weight models never stop)
    ttfa_slo_ms: float | None = Field(default=None, gt=0)

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format == "audio"

    def check(self, served_models: list[str], checkpoint_kind: str) -> None:
        if self.model is not None and self.model not in served_models:
            raise ValueError(f"model {self.model!r} is not served here; served: {served_models}")
        if not self.input.strip():
            raise ValueError("input must not be empty")
        if len(self.input) > MAX_INPUT_CHARS:
            raise ValueError(f"input is {len(self.input)} characters; at most {MAX_INPUT_CHARS} are accepted")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format {self.response_format!r} is not supported; use one of "
                             f"{list(RESPONSE_FORMATS)}")
        if self.stream_format not in (None, "audio"):
            raise ValueError(f"stream_format {self.stream_format!r} is not supported; use \"audio\" (or stream=true)")
        if self.speed != 1.0:
            raise ValueError("speed must be 1.0: this server does not change the speaking rate")
        if self.task_type is not None:
            if self.task_type not in TASK_TYPES:
                raise ValueError(f"task_type {self.task_type!r} is unknown; use one of {list(TASK_TYPES)}")
            if TASK_TYPES[self.task_type] != checkpoint_kind:
                served = {v: k for k, v in TASK_TYPES.items()}[checkpoint_kind]
                raise ValueError(f"task_type {self.task_type!r} needs a {self.task_type} checkpoint; this server "
                                 f"serves a {served} checkpoint")


def decode_reference_audio(data: str, sample_rate: int = 24000) -> np.ndarray:
    """base64 (or a data URL) of an audio file soundfile can read -> float32 mono at `sample_rate`."""
    import soundfile

    if data.startswith("data:"):
        if "," not in data:
            raise ValueError("ref_audio data URL has no payload")
        data = data.split(",", 1)[1]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("ref_audio is not valid base64") from None
    try:
        audio, rate = soundfile.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises its own LibsndfileError and RuntimeError types
        raise ValueError(f"ref_audio could not be decoded as audio: {exc}") from None
    if rate != sample_rate:
        raise ValueError(f"ref_audio must be sampled at {sample_rate} Hz, got {rate} Hz")
    mono = audio.mean(axis=1)
    if mono.size == 0:
        raise ValueError("ref_audio is empty")
    return mono.astype(np.float32)
