"""Every response format, whole and streamed, read back by a decoder other than the encoder (libsndfile; ADTS headers
for AAC): its rate and its length within one 80 ms frame; streamed mp3 and Ogg/Opus decode from their first chunk."""

from __future__ import annotations

import numpy as np
import pytest

from tests.entrypoints.audio_decoding import decode
from vllm_voxserve.entrypoints.audio_encoding import (
    RESPONSE_FORMATS,
    STREAMED_FORMATS,
    AudioEncoder,
    time_stretch,
)

RATE = 24000
FRAME = 1920  # one 80 ms frame of the model: the tolerance on lengths (codec priming and padding stay below it)
CHUNK = 10 * FRAME  # the server's chunks


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def encode_chunks(fmt: str, audio: np.ndarray, streaming: bool) -> list[bytes]:
    encoder = AudioEncoder(fmt, RATE, streaming=streaming)
    parts = [encoder.encode(audio[i:i + CHUNK]) for i in range(0, len(audio), CHUNK)]
    return [*parts, encoder.finish()]


def dominant_hz(audio: np.ndarray) -> float:
    window = audio[len(audio) // 4: len(audio) // 4 + 8192]
    return float(np.argmax(np.abs(np.fft.rfft(window * np.hanning(len(window))))) * RATE / len(window))


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_a_whole_file_decodes_at_24_khz_with_the_audio_length(fmt):
    audio = tone(2.3)
    parts = encode_chunks(fmt, audio, streaming=False)
    assert not any(parts[:-1])  # a whole file comes at the end, in one piece
    decoded, rate, samples = decode(fmt, parts[-1])
    assert rate == RATE
    assert abs(samples - len(audio)) < FRAME, (samples, len(audio))
    if decoded is not None:
        assert abs(dominant_hz(decoded) - 440) < 10


@pytest.mark.parametrize("fmt", STREAMED_FORMATS)
def test_a_stream_sends_bytes_with_every_chunk_and_decodes_whole(fmt):
    audio = tone(3.1)
    parts = encode_chunks(fmt, audio, streaming=True)
    assert all(parts[:-1]), [len(p) for p in parts]  # no chunk's audio waits for the end
    decoded, rate, samples = decode(fmt, b"".join(parts))
    assert rate == RATE
    assert abs(samples - len(audio)) < FRAME, (samples, len(audio))
    if decoded is not None:
        assert abs(dominant_hz(decoded) - 440) < 10


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_a_player_starts_decoding_from_the_first_chunk_alone(fmt):
    parts = encode_chunks(fmt, tone(3.0), streaming=True)
    decoded, rate, samples = decode(fmt, parts[0])
    assert rate == RATE
    # most of the first chunk's 800 ms are playable before the second chunk's bytes exist
    assert samples > CHUNK // 2, samples
    assert abs(dominant_hz(decoded) - 440) < 10


def test_aac_streams_adts_frames_that_each_start_with_a_header():
    parts = encode_chunks("aac", tone(2.0), streaming=True)
    rate, samples = decode("aac", parts[0])[1:]  # the first chunk alone is whole ADTS frames
    assert rate == RATE and samples > 0


def test_a_closed_stream_encodes_nothing_more():
    encoder = AudioEncoder("mp3", RATE, streaming=True)
    assert encoder.encode(tone(1.0))
    encoder.close()
    assert encoder.encode(tone(1.0)) == b"" and encoder.finish() == b""


def test_an_unknown_format_names_response_format():
    with pytest.raises(ValueError, match="response_format 'ogg'"):
        AudioEncoder("ogg")


@pytest.mark.parametrize("speed", [0.25, 0.4, 0.5, 0.8, 1.5, 2.0, 4.0])
def test_time_stretch_changes_the_length_by_the_speed_and_keeps_the_pitch(speed):
    audio = tone(2.0)
    stretched = time_stretch(audio, speed, RATE)
    assert abs(len(stretched) - len(audio) / speed) < FRAME, (len(stretched), len(audio) / speed)
    assert abs(dominant_hz(stretched) - 440) < 10


def test_time_stretch_at_speed_1_is_the_audio_itself():
    audio = tone(0.5)
    assert time_stretch(audio, 1.0, RATE) is audio
