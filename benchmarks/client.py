"""Streaming HTTP client for OpenAI-style `POST /v1/audio/speech` (stream=true) with per-chunk timestamps."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.metrics import COMPLETED, FAILED, REJECTED, TIMED_OUT, Timeline

REJECT_STATUSES = (429, 503)
# WAV data sizes that mean "unknown length" in streamed headers.
_OPEN_ENDED_SIZES = (0, 0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFF - 8)


@dataclass(frozen=True, slots=True)
class ServerProfile:
    """Which request fields a server accepts. `extra` is merged into every request last, so it overrides."""

    name: str
    path: str = "/v1/audio/speech"
    model: str | None = None
    voice: str | None = "vivian"
    response_format: str = "pcm"
    sample_rate: int = 24000  # used for pcm; a WAV header's own format wins
    sample_width: int = 2
    channels: int = 1
    qwen_fields: bool = True  # task_type / language / instructions, each only when set (not None or "")
    task_type: str | None = None
    language: str | None = "English"
    instructions: str | None = None
    # Fixed-length runs set these fields to the frame count plus `length_token_offset` (our server's last sampled
    # token never becomes audio, so N frames take N + 1 tokens) and add `fixed_length_extra`.
    length_fields: tuple[str, ...] = ("max_new_tokens",)
    length_token_offset: int = 1
    fixed_length_extra: tuple[tuple[str, Any], ...] = (("ignore_eos", True),)
    send_seed: bool = True
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.response_format not in ("pcm", "wav"):
            raise ValueError(f"response_format must be pcm or wav, got {self.response_format!r}")
        if self.sample_rate <= 0 or self.sample_width not in (1, 2, 3, 4) or self.channels <= 0:
            raise ValueError("bad audio format: need sample_rate > 0, sample_width in 1..4, channels > 0")
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")

    @property
    def bytes_per_second(self) -> int:
        return self.sample_rate * self.sample_width * self.channels


PROFILES = {
    "ours": ServerProfile(name="ours"),
    # vLLM-Omni's speech API takes the same OpenAI + Qwen fields; no per-request seed and no forced length.
    # vLLM-Omni answers `stream: true` with SSE events of base64 audio; `stream_format: audio` streams raw bytes.
    "vllm-omni": ServerProfile(name="vllm-omni", task_type="CustomVoice", send_seed=False, length_token_offset=0,
                               fixed_length_extra=(), extra=(("stream_format", "audio"),)),
    # Plain OpenAI fields only.
    "generic": ServerProfile(name="generic", voice="alloy", qwen_fields=False, send_seed=False,
                             length_fields=(), fixed_length_extra=()),
}


def make_profile(name: str, extra_json: str | None = None, **overrides: Any) -> ServerProfile:
    """A named profile with field overrides (None values are ignored) and extra JSON merged into every request."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}")
    base = PROFILES[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    if extra_json:
        extra = json.loads(extra_json)
        if not isinstance(extra, dict):
            raise ValueError("extra JSON must be an object")
        changes["extra"] = tuple((dict(base.extra) | extra).items())
    return ServerProfile(**{**_profile_fields(base), **changes})


def _profile_fields(profile: ServerProfile) -> dict[str, Any]:
    return {name: getattr(profile, name) for name in ServerProfile.__slots__}


def build_payload(profile: ServerProfile, text: str, num_frames: int | None = None, seed: int | None = None) -> dict:
    """The JSON body of one request. `num_frames` forces a fixed length (random-weight models never stop)."""
    body: dict[str, Any] = {"input": text, "response_format": profile.response_format, "stream": True}
    if profile.model:
        body["model"] = profile.model
    if profile.voice:
        body["voice"] = profile.voice
    if profile.qwen_fields:
        for key in ("task_type", "language", "instructions"):
            value = getattr(profile, key)
            if value:
                body[key] = value
    if num_frames is not None:
        body.update({key: num_frames + profile.length_token_offset for key in profile.length_fields})
        body.update(dict(profile.fixed_length_extra))
    if seed is not None and profile.send_seed:
        body["seed"] = seed
    body.update(dict(profile.extra))
    return body


class AudioStreamParser:
    """Splits a response stream into header bytes and audio bytes.

    A stream starting with "RIFF" is parsed as WAV: bytes up to and including the "data" chunk header are not
    audio, and the "fmt " chunk sets the byte rate. When a data chunk has a definite size and another "RIFF" follows
    it, that is parsed as a new header (servers that send one WAV file per chunk). Anything else is raw PCM.
    """

    def __init__(self, bytes_per_second: int, expect_wav: bool):
        self.bytes_per_second = bytes_per_second
        self.header_bytes = 0
        self.wav_format: dict[str, int] | None = None
        self._pending = b""  # undecided bytes at a possible header start
        self._in_header = expect_wav
        self._data_left: int | None = None  # bytes left in a definite-size data chunk; None = open-ended/raw

    def feed(self, data: bytes) -> int:
        """Audio bytes in `data` (header bytes are counted in `header_bytes`)."""
        audio = 0
        buf = self._pending + data
        self._pending = b""
        while buf:
            if self._in_header:
                if len(buf) < 4 and b"RIFF".startswith(buf):
                    self._pending = buf
                    return audio
                if not buf.startswith(b"RIFF"):
                    self._in_header = False  # raw PCM after all
                    continue
                consumed = self._parse_header(buf)
                if consumed is None:
                    self._pending = buf
                    return audio
                self.header_bytes += consumed
                buf = buf[consumed:]
                self._in_header = False
                continue
            if self._data_left is None:
                return audio + len(buf)
            take = min(self._data_left, len(buf))
            audio += take
            self._data_left -= take
            buf = buf[take:]
            if self._data_left == 0:
                self._data_left = None
                self._in_header = True
        return audio

    def _parse_header(self, buf: bytes) -> int | None:
        """Length of a complete RIFF header through the data-chunk header, or None if more bytes are needed."""
        if len(buf) < 12:
            return None
        if buf[8:12] != b"WAVE":
            raise ValueError("RIFF stream is not WAVE")
        pos = 12
        while True:
            if len(buf) < pos + 8:
                return None
            chunk_id, size = buf[pos:pos + 4], struct.unpack("<I", buf[pos + 4:pos + 8])[0]
            if chunk_id == b"data":
                self._data_left = None if size in _OPEN_ENDED_SIZES else size
                return pos + 8
            if len(buf) < pos + 8 + size:
                return None
            if chunk_id == b"fmt ":
                channels, rate, byte_rate = struct.unpack("<HII", buf[pos + 10:pos + 20])
                self.wav_format = {"channels": channels, "sample_rate": rate, "byte_rate": byte_rate}
                if byte_rate > 0:
                    self.bytes_per_second = byte_rate
            pos += 8 + size + (size & 1)


@dataclass(slots=True)
class RequestRecord:
    """One request's timeline. Times are seconds from the run's start (its schedule origin)."""

    index: int
    text: str
    num_words: int
    num_frames: int | None
    scheduled_s: float
    sent_s: float | None = None
    status: int | None = None
    outcome: str | None = None
    error: str | None = None
    retry_after: str | None = None
    header_bytes: int = 0
    bytes_per_second: int | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # every network chunk's arrival
    chunk_audio_bytes: list[int] = field(default_factory=list)  # audio bytes in it (header excluded)
    finished_s: float | None = None

    def timeline(self) -> Timeline:
        rate = self.bytes_per_second or 1
        return Timeline(
            sent_s=self.sent_s if self.sent_s is not None else self.scheduled_s,
            outcome=self.outcome or FAILED,
            chunk_times_s=tuple(self.chunk_times_s),
            chunk_audio_s=tuple(b / rate for b in self.chunk_audio_bytes),
        )

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


async def stream_request(session: aiohttp.ClientSession, url: str, payload: dict, profile: ServerProfile,
                         record: RequestRecord, origin: float, timeout_s: float) -> RequestRecord:
    """Send one request and fill `record`; never raises for server-side trouble (it is recorded as the outcome)."""
    parser = AudioStreamParser(profile.bytes_per_second, expect_wav=profile.response_format == "wav")
    record.sent_s = time.perf_counter() - origin
    try:
        await asyncio.wait_for(_stream_into(session, url, payload, parser, record, origin), timeout_s)
    except asyncio.TimeoutError:
        record.outcome, record.error = TIMED_OUT, f"no end of stream within {timeout_s} s"
    except (aiohttp.ClientError, ValueError, OSError) as exc:
        record.outcome, record.error = FAILED, f"{type(exc).__name__}: {exc}"
    finally:  # also when the caller cancels us (the outcome is then the caller's to set)
        record.finished_s = time.perf_counter() - origin
        record.header_bytes = parser.header_bytes
        record.bytes_per_second = parser.bytes_per_second
    return record


async def _stream_into(session: aiohttp.ClientSession, url: str, payload: dict, parser: AudioStreamParser,
                       record: RequestRecord, origin: float) -> None:
    async with session.post(url, json=payload) as response:
        record.status = response.status
        if response.status != 200:
            record.retry_after = response.headers.get("Retry-After")
            body = (await response.read())[:300]
            record.outcome = REJECTED if response.status in REJECT_STATUSES else FAILED
            record.error = body.decode("utf-8", "replace")
            return
        content_type = response.headers.get("Content-Type", "")
        if content_type.startswith(("application/json", "text/")):  # an error reported with status 200
            record.outcome = FAILED
            record.error = f"{content_type}: " + (await response.read())[:300].decode("utf-8", "replace")
            return
        async for data in response.content.iter_any():
            record.chunk_times_s.append(time.perf_counter() - origin)
            record.chunk_audio_bytes.append(parser.feed(data))
    if sum(record.chunk_audio_bytes) == 0:
        record.outcome, record.error = FAILED, "stream ended without audio"
    else:
        record.outcome = COMPLETED
