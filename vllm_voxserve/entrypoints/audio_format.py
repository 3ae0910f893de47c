"""Response bodies of `/v1/audio/speech`: float32 mono audio (24 kHz) to 16-bit PCM or WAV bytes. Pure functions.

- Non-streaming: `wav_bytes(concat(chunks))` (a complete WAV) or `pcm16_bytes(concat(chunks))` (raw PCM).
- Streaming: for WAV send `streaming_wav_header()` first; then `pcm16_bytes(chunk)` for every chunk. That header is
  the one of a WAV of unknown length (RIFF and data sizes 0xFFFFFFFF), as OpenAI's streaming WAV does, so a client
  can start playing at once; readers take the samples to run to the end of the body.
"""

from __future__ import annotations

import struct

import numpy as np

from vllm_voxserve.contract import SAMPLE_RATE

_PCM16_SCALE = 32767.0  # full scale 1.0 -> 32767, so +1 and -1 stay symmetric and nothing wraps
_HEADER_BYTES = 44
_UNKNOWN_SIZE = 0xFFFFFFFF  # the largest a 32-bit RIFF size field can say


def _check_rate(sample_rate: int) -> None:
    # byte_rate = 2 * sample_rate must fit the header's 32-bit field
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or not 0 < sample_rate < 2**31:
        raise ValueError(f"sample_rate must be a positive int below 2**31, got {sample_rate!r}")


def concat(chunks: list[np.ndarray]) -> np.ndarray:
    """The chunks of one response as one float32 array (empty when there are none)."""
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.asarray(c, dtype=np.float32).reshape(-1) for c in chunks])


def pcm16_bytes(audio: np.ndarray) -> bytes:
    """Mono float audio in [-1, 1] -> signed 16-bit little-endian PCM. Out-of-range values clip; NaN becomes 0."""
    samples = np.asarray(audio)
    if samples.ndim != 1:
        raise ValueError(f"expected mono audio of shape [samples], got shape {samples.shape}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"expected float audio, got dtype {samples.dtype}")
    # One float32 product, then every step in place: this runs for each chunk of every pcm and wav stream (a third
    # of the time of nan_to_num, clip, scale). Scaling before the clip gives the same samples: |x| <= 1 scales
    # alike, larger values and infinities clip to full scale.
    scaled = np.multiply(samples, _PCM16_SCALE, dtype=np.float32)
    nan = np.isnan(scaled)
    if nan.any():
        scaled[nan] = 0.0
    np.clip(scaled, -_PCM16_SCALE, _PCM16_SCALE, out=scaled)
    np.rint(scaled, out=scaled)
    return scaled.astype("<i2").tobytes()


def wav_header(sample_rate: int = SAMPLE_RATE, data_bytes: int | None = None) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV with `data_bytes` of samples; None: unknown length (streaming)."""
    _check_rate(sample_rate)
    if data_bytes is None:
        riff_size = data_size = _UNKNOWN_SIZE
    else:
        if data_bytes < 0 or data_bytes % 2 or data_bytes > _UNKNOWN_SIZE - (_HEADER_BYTES - 8):
            raise ValueError(f"data_bytes must be an even count of at most 4 GiB - 36, got {data_bytes}")
        riff_size, data_size = data_bytes + _HEADER_BYTES - 8, data_bytes
    channels, bits = 1, 16
    block_align = channels * bits // 8
    return (
        struct.pack("<4sI4s", b"RIFF", riff_size, b"WAVE")
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, bits)
        + struct.pack("<4sI", b"data", data_size)
    )


def wav_bytes(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A complete WAV file (mono, 16-bit PCM) of `audio`."""
    pcm = pcm16_bytes(audio)
    return wav_header(sample_rate, len(pcm)) + pcm


def streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """The header a streaming WAV response starts with: length unknown, PCM chunks follow until the body ends."""
    return wav_header(sample_rate, None)
