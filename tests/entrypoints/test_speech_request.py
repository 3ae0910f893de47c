"""The speech request's own rules: numeric ranges, text that can be spoken, length limits, and reference clips at any
sample rate or channel count resampled to 24 kHz mono (soxr)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile
from pydantic import ValidationError

from vllm_voxserve.entrypoints.speech_request import SpeechRequest, decode_reference_audio

SERVED = ["tiny"]


def valid(**fields) -> SpeechRequest:
    request = SpeechRequest.model_validate({"input": "Hello", **fields})
    request.check(SERVED, "custom_voice", max_input_chars=50, max_instructions_chars=20)
    return request


def refused(**fields) -> str:
    with pytest.raises((ValueError, ValidationError)) as info:
        valid(**fields)
    return str(info.value)


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 0, -1])
def test_a_seed_is_any_signed_64_bit_integer(seed):
    assert valid(seed=seed).seed == seed


@pytest.mark.parametrize("field, value, words", [
    ("seed", 2**63, "seed"), ("seed", 2**64 - 1, "seed"), ("seed", -(2**63) - 1, "seed"),
    ("top_k", 2**31, "top_k"), ("subtalker_top_k", 2**31, "subtalker_top_k"), ("top_k", -1, "top_k"),
    ("temperature", 2.5, "temperature"), ("temperature", -0.1, "temperature"),
    ("temperature", float("nan"), "temperature"), ("subtalker_temperature", float("inf"), "subtalker_temperature"),
    ("repetition_penalty", 0, "repetition_penalty"), ("repetition_penalty", 1e9, "repetition_penalty"),
    ("top_p", 0, "top_p"), ("subtalker_top_p", 1.5, "subtalker_top_p"),
    ("ttfa_slo_ms", 0, "ttfa_slo_ms"), ("ttfa_slo_ms", 60000.5, "ttfa_slo_ms"),
    ("ttfa_slo_ms", float("inf"), "ttfa_slo_ms"), ("max_new_tokens", 1, "max_new_tokens"),
    ("voice", "v" * 257, "voice"), ("language", "l" * 257, "language"), ("model", "m" * 257, "model"),
])
def test_numbers_and_names_out_of_range_name_the_field(field, value, words):
    assert words in refused(**{field: value})


def test_ttfa_slo_ms_takes_up_to_a_minute():
    assert valid(ttfa_slo_ms=60000).ttfa_slo_ms == 60000


@pytest.mark.parametrize("text", ["\x00\x00", "\x01\x02\x1f", "   \n\t", "?!... --", "\u200b\u200b"])
def test_input_with_nothing_to_speak_is_refused(text):
    message = refused(input=text)
    assert message.startswith("input")


@pytest.mark.parametrize("text", ["7", "Ö", "你好", "مرحبا", "…ok!"])
def test_any_letter_or_digit_of_any_script_is_speakable(text):
    assert valid(input=text).input == text


def test_control_characters_are_refused_by_field_but_line_breaks_pass():
    assert "input contains the control character U+0000 at character 5" in refused(input="Hello\x00there")
    assert "instructions contains the control character U+0007" in refused(instructions="calm\x07")
    assert valid(input="Line one.\r\nLine two.\tEnd").input


def test_lengths_follow_the_configured_limits():
    assert "input is 51 characters; at most 50" in refused(input="a" * 51)
    assert "instructions is 21 characters; at most 20" in refused(instructions="b" * 21)
    assert "ref_text is 51 characters" in refused(ref_text="c" * 51)
    assert valid(input="a" * 50, instructions="b" * 20).input


def clip_b64(rate: int, seconds: float, channels: int = 1, subtype: str = "PCM_16", fmt: str = "WAV") -> str:
    t = np.arange(int(rate * seconds)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    audio = np.stack([tone * (c + 1) / channels for c in range(channels)], axis=1)
    out = io.BytesIO()
    soundfile.write(out, audio, rate, subtype=subtype, format=fmt)
    return base64.b64encode(out.getvalue()).decode()


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_a_clip_at_any_common_rate_becomes_24_khz_with_its_tone_kept(rate):
    audio = decode_reference_audio(clip_b64(rate, 1.0))
    assert audio.dtype == np.float32 and abs(len(audio) - 24000) <= 1
    spectrum = np.abs(np.fft.rfft(audio[2000:22000]))
    assert abs(np.argmax(spectrum) * 24000 / 20000 - 440) < 3  # the tone is still at 440 Hz


def test_a_stereo_clip_is_averaged_to_mono():
    audio = decode_reference_audio(clip_b64(48000, 0.5, channels=2))
    mono = decode_reference_audio(clip_b64(48000, 0.5, channels=1))
    np.testing.assert_allclose(audio, mono * 0.75, atol=2e-3)  # channels at 1/2 and 2/2 of the tone


def test_data_urls_and_other_formats_decode():
    assert len(decode_reference_audio("data:audio/wav;base64," + clip_b64(16000, 0.25))) == 6000
    assert len(decode_reference_audio(clip_b64(24000, 0.25, subtype="FLOAT"))) == 6000
    assert len(decode_reference_audio(clip_b64(44100, 0.5, subtype="PCM_16", fmt="FLAC"))) == 12000


def test_clip_limits_and_bad_clips_name_ref_audio():
    with pytest.raises(ValueError, match=r"ref_audio is 3.0 s long; at most 2 s"):
        decode_reference_audio(clip_b64(8000, 3.0), max_seconds=2)
    with pytest.raises(ValueError, match=r"ref_audio is over 1000 bytes"):
        decode_reference_audio(clip_b64(8000, 1.0), max_bytes=1000)
    with pytest.raises(ValueError, match="ref_audio is not valid base64"):
        decode_reference_audio("not base64!")
    with pytest.raises(ValueError, match="ref_audio could not be decoded"):
        decode_reference_audio(base64.b64encode(b"RIFF1234WAVEjunk").decode())
    with pytest.raises(ValueError, match="ref_audio is empty"):
        decode_reference_audio(clip_b64(24000, 0.0))
    out = io.BytesIO()
    soundfile.write(out, np.array([0.1, np.nan, 0.2], dtype=np.float32), 24000, subtype="FLOAT", format="WAV")
    with pytest.raises(ValueError, match="ref_audio has samples that are not finite"):
        decode_reference_audio(base64.b64encode(out.getvalue()).decode())


def test_the_default_format_is_mp3_as_in_openai():
    assert valid().response_format == "mp3"


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_openai_format_is_accepted_whole(fmt):
    assert valid(response_format=fmt).response_format == fmt


@pytest.mark.parametrize("fields, words", [
    ({"response_format": "ogg"}, "response_format 'ogg' is not supported"),
    ({"response_format": "flac", "stream": True}, "response_format 'flac' is for whole-file responses only"),
    ({"response_format": "flac", "stream_format": "sse"}, "response_format 'flac' is for whole-file"),
    ({"stream_format": "events"}, "stream_format 'events' is not supported"),
    ({"speed": 0.2}, "speed"), ({"speed": 4.01}, "speed"), ({"speed": float("nan")}, "speed"),
    ({"speed": 2.0, "stream": True}, "speed 2 is only for whole-file responses"),
    ({"speed": 0.5, "stream_format": "audio"}, "speed 0.5 is only for whole-file responses"),
])
def test_bad_format_stream_and_speed_combinations_name_the_field(fields, words):
    assert words in refused(**fields)


@pytest.mark.parametrize("speed", [0.25, 1.0, 4.0])
def test_speed_takes_openais_range_for_whole_files(speed):
    assert valid(speed=speed).speed == speed


def test_both_stream_formats_stream():
    assert valid(stream_format="audio").streaming and not valid(stream_format="audio").sse
    assert valid(stream_format="sse").streaming and valid(stream_format="sse").sse
    assert not valid().streaming
