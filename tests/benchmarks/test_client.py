import struct

import pytest

from benchmarks.client import AudioStreamParser, RequestRecord, build_payload, make_profile
from benchmarks.metrics import COMPLETED
from tests.benchmarks.fake_speech_server import wav_header


def feed_all(parser, pieces):
    return [parser.feed(p) for p in pieces]


def test_pcm_bytes_are_all_audio():
    parser = AudioStreamParser(48000, expect_wav=False)
    assert feed_all(parser, [b"\x00" * 10, b"\x01" * 6]) == [10, 6]
    assert parser.header_bytes == 0


def test_wav_header_alone_is_not_audio():
    header = wav_header()
    parser = AudioStreamParser(48000, expect_wav=True)
    assert feed_all(parser, [header, b"\x00" * 100]) == [0, 100]
    assert parser.header_bytes == len(header) == 44


def test_wav_header_split_byte_by_byte_then_audio_in_same_chunk():
    header = wav_header(sample_rate=16000)
    parser = AudioStreamParser(48000, expect_wav=True)
    counts = feed_all(parser, [bytes([b]) for b in header[:-1]] + [header[-1:] + b"\x00" * 32])
    assert counts == [0] * (len(header) - 1) + [32]
    assert parser.bytes_per_second == 32000  # the header's format wins over the profile's
    assert parser.wav_format["sample_rate"] == 16000


def test_wav_with_extra_chunk_before_data():
    header = wav_header()
    fmt_end = 12 + 8 + 16
    extra = b"LIST" + struct.pack("<I", 5) + b"abcde" + b"\x00"  # odd size: padded
    stream = header[:fmt_end] + extra + header[fmt_end:] + b"\x00" * 8
    parser = AudioStreamParser(48000, expect_wav=True)
    assert parser.feed(stream) == 8
    assert parser.header_bytes == len(header) + len(extra)


def test_one_wav_file_per_chunk():
    def wav_file(n):
        return header_with_size(n) + b"\x00" * n

    def header_with_size(n):
        return wav_header()[:-4] + struct.pack("<I", n)

    parser = AudioStreamParser(48000, expect_wav=True)
    assert feed_all(parser, [wav_file(100), wav_file(50)[:30], wav_file(50)[30:]]) == [100, 0, 50]
    assert parser.header_bytes == 88


def test_wav_expected_but_raw_pcm_sent():
    parser = AudioStreamParser(48000, expect_wav=True)
    assert parser.feed(b"\x10\x20" * 8) == 16


def test_payload_profiles_and_fixed_length():
    ours = make_profile("ours", model="m", task_type="CustomVoice")
    body = build_payload(ours, "hello there", num_frames=10, seed=7)
    assert body["input"] == "hello there" and body["stream"] is True and body["response_format"] == "pcm"
    assert body["max_new_tokens"] == 11 and body["ignore_eos"] is True  # 10 frames take 11 tokens on our server
    assert body["seed"] == 7 and body["task_type"] == "CustomVoice" and body["model"] == "m"
    assert "max_new_tokens" not in build_payload(ours, "hi")
    assert "voice" not in build_payload(make_profile("ours", voice=""), "hi")  # "" leaves a field out
    omni = build_payload(make_profile("vllm-omni"), "hi", num_frames=10)
    assert omni["max_new_tokens"] == 10 and omni["stream_format"] == "audio"  # raw bytes, not SSE events

    generic = build_payload(make_profile("generic"), "hi", num_frames=10, seed=7)
    assert set(generic) == {"input", "voice", "response_format", "stream"}

    overridden = build_payload(make_profile("vllm-omni", '{"voice": "ryan", "speed": 1.5}'), "hi", seed=7)
    assert overridden["voice"] == "ryan" and overridden["speed"] == 1.5 and "seed" not in overridden


def test_bad_profile_values():
    with pytest.raises(ValueError):
        make_profile("nope")
    with pytest.raises(ValueError):
        make_profile("ours", response_format="mp3")
    with pytest.raises(ValueError):
        make_profile("ours", '["not", "an", "object"]')


def test_record_timeline_converts_bytes_to_seconds():
    record = RequestRecord(index=0, text="a b", num_words=2, num_frames=None, scheduled_s=1.0, sent_s=1.001,
                           outcome=COMPLETED, bytes_per_second=48000, chunk_times_s=[1.05, 1.2],
                           chunk_audio_bytes=[0, 24000])
    tl = record.timeline()
    assert tl.chunk_audio_s == (0.0, 0.5) and tl.sent_s == 1.001
