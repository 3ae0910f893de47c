"""The body of `POST /v1/audio/speech`: OpenAI's fields, Qwen3-TTS's fields, and fields for tests and benchmarks.

Validation here raises `ValueError` with a message meant for the client (the route turns it into HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import unicodedata

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from vllm_voxserve.contract import SAMPLE_RATE

MAX_INPUT_CHARS = 4096  # the default of voxserve.max_input_chars
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # audio_encoding.RESPONSE_FORMATS
STREAMED_FORMATS = ("mp3", "opus", "aac", "wav", "pcm")  # audio_encoding.STREAMED_FORMATS
STREAM_FORMATS = ("audio", "sse")
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # a seed is any signed 64-bit integer (the worker keeps it in int64)
INT32_MAX = 2**31 - 1  # vLLM keeps top_k in an int32 tensor
MAX_NAME_CHARS = 256  # model, voice, language and the other names: an over-long one is never valid
# C0/C1 control characters other than tab, newline and carriage return have no spoken form.
_ALLOWED_CONTROLS = {"\t", "\n", "\r"}


class SpeechRequest(BaseModel):
    # allow_inf_nan: the route rejects NaN/Infinity first with the field's name; this keeps the schema honest too
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # OpenAI
    model: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    input: str
    voice: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    response_format: str = Field(default="mp3", max_length=MAX_NAME_CHARS)  # OpenAI's default
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED)  # whole-file responses only
    stream: bool = False
    # OpenAI's: "audio" streams the audio bytes (as stream=true); "sse" sends them base64 in server-sent events
    stream_format: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    instructions: str | None = None
    # Qwen3-TTS
    # CustomVoice | VoiceDesign | Base; must match the served checkpoint
    task_type: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    language: str = Field(default="auto", max_length=MAX_NAME_CHARS)
    ref_audio: str | None = None  # base64 or data URL of an audio file (Base voice cloning); resampled to 24 kHz
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    non_streaming_mode: bool | None = None  # text fed all at once (True) or one token per frame (False)
    # sampling (defaults are the checkpoint's generation_config.json); temperatures in vLLM's range [0, 2]
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    subtalker_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    subtalker_top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    subtalker_top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    # length control: N tokens give N-1 frames of 80 ms (the last sampled token never becomes audio)
    max_new_tokens: int = Field(default=2048, ge=2, le=16384)
    ignore_eos: bool = False  # run to max_new_tokens (fixed length; random-weight models never stop)
    ttfa_slo_ms: float | None = Field(default=None, gt=0, le=60000)

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format is not None

    @property
    def sse(self) -> bool:
        return self.stream_format == "sse"

    def check(self, served_models: list[str], checkpoint_kind: str, max_input_chars: int = MAX_INPUT_CHARS,
              max_instructions_chars: int = MAX_INPUT_CHARS) -> None:
        if self.model is not None and self.model not in served_models:
            raise ValueError(f"model {self.model!r} is not served here; served: {served_models}")
        if not self.input.strip():
            raise ValueError("input must not be empty")
        for name, limit in (("input", max_input_chars), ("ref_text", max_input_chars),
                            ("instructions", max_instructions_chars)):
            text = getattr(self, name)
            if text is not None and len(text) > limit:
                raise ValueError(f"{name} is {len(text)} characters; at most {limit} are accepted")
            if text:
                check_text(name, text)
        if not has_speakable_text(self.input):
            raise ValueError("input has nothing to speak: it needs at least one letter or digit")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format {self.response_format!r} is not supported; use one of "
                             f"{list(RESPONSE_FORMATS)}")
        if self.stream_format is not None and self.stream_format not in STREAM_FORMATS:
            raise ValueError(f"stream_format {self.stream_format!r} is not supported; use one of "
                             f"{list(STREAM_FORMATS)}")
        if self.streaming and self.response_format not in STREAMED_FORMATS:
            raise ValueError(f"response_format {self.response_format!r} is for whole-file responses only; stream one "
                             f"of {list(STREAMED_FORMATS)}, or drop stream/stream_format")
        if self.speed != 1.0 and self.streaming:
            raise ValueError(f"speed {self.speed:g} is only for whole-file responses: a streamed response plays at "
                             "speed 1.0; drop stream/stream_format or speed")
        if self.task_type is not None:
            if self.task_type not in TASK_TYPES:
                raise ValueError(f"task_type {self.task_type!r} is unknown; use one of {list(TASK_TYPES)}")
            if TASK_TYPES[self.task_type] != checkpoint_kind:
                served = {v: k for k, v in TASK_TYPES.items()}[checkpoint_kind]
                raise ValueError(f"task_type {self.task_type!r} needs a {self.task_type} checkpoint; this server "
                                 f"serves a {served} checkpoint")


def check_text(field: str, text: str) -> None:
    """ValueError naming the field for a control character (other than tab and line breaks)."""
    for index, char in enumerate(text):
        if unicodedata.category(char) == "Cc" and char not in _ALLOWED_CONTROLS:
            raise ValueError(f"{field} contains the control character U+{ord(char):04X} at character {index}")


def has_speakable_text(text: str) -> bool:
    """At least one letter or digit of any script (punctuation, symbols and spaces alone say nothing)."""
    return any(unicodedata.category(char)[0] in "LN" for char in text)


def decode_reference_audio(data: str, sample_rate: int = SAMPLE_RATE, max_bytes: int = 16 << 20,
                           max_seconds: float = 30.0) -> np.ndarray:
    """base64 (or a data URL) of an audio file soundfile can read, at any sample rate, mono or not -> float32 mono at
    `sample_rate` (channels averaged, resampled with soxr). ValueError naming ref_audio for what is refused."""
    if data.startswith("data:"):
        if "," not in data:
            raise ValueError("ref_audio data URL has no payload")
        data = data.split(",", 1)[1]
    if len(data) > (max_bytes + 2) // 3 * 4:  # the base64 length of max_bytes, checked before decoding it
        raise ValueError(f"ref_audio is over {max_bytes} bytes; at most {max_bytes} (voxserve.max_ref_audio_bytes)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("ref_audio is not valid base64") from None
    return read_reference_clip(raw, sample_rate, max_seconds)


def read_reference_clip(raw: bytes, sample_rate: int = 24000, max_seconds: float = 30.0,
                        field: str = "ref_audio") -> np.ndarray:
    """The bytes of an audio file soundfile can read -> float32 mono at `sample_rate`; ValueError naming `field`."""
    import soundfile
    import soxr

    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as clip:
            rate, frames = clip.samplerate, clip.frames
            # from the header: a clip over the limit is never decoded
            audio = clip.read(dtype="float32", always_2d=True) if frames <= max_seconds * rate else None
    except Exception as exc:  # soundfile raises its own LibsndfileError and RuntimeError types
        raise ValueError(f"{field} could not be decoded as audio: {exc}") from None
    if audio is None:
        raise ValueError(f"{field} is {frames / rate:.1f} s long; at most {max_seconds:g} s are accepted "
                         "(voxserve.max_ref_audio_seconds)")
    if audio.size == 0:
        raise ValueError(f"{field} is empty")
    if not np.isfinite(audio).all():
        raise ValueError(f"{field} has samples that are not finite numbers (NaN or infinity)")
    mono = audio.mean(axis=1)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)
