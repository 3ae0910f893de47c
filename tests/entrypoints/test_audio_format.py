import io
import struct
import wave

import numpy as np
import pytest
import soundfile as sf

from vllm_voxserve.entrypoints import audio_format as af

RATE = af.SAMPLE_RATE
STEP = 1 / 32768  # soundfile reads 16-bit PCM back as int / 32768


def _tone(seconds: float = 0.25, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_pcm16_scaling_rounding_and_clipping():
    audio = np.array([0.0, 1.0, -1.0, 0.5, -0.5, 1e-5, 2.0, -3.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    pcm = np.frombuffer(af.pcm16_bytes(audio), dtype="<i2")
    assert pcm.tolist() == [0, 32767, -32767, 16384, -16384, 0, 32767, -32767, 0, 32767, -32767]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pcm16_matches_the_plain_formula_sample_for_sample_and_leaves_its_input_alone(dtype):
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(19_200) * 0.7).astype(dtype)
    audio[::997] = np.nan
    audio[1::991], audio[2::983] = np.inf, -np.inf
    kept = audio.copy()
    plain = np.rint(np.clip(np.nan_to_num(audio.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
                    * 32767.0).astype("<i2").tobytes()
    assert af.pcm16_bytes(audio) == plain
    np.testing.assert_array_equal(audio, kept)


def test_pcm16_is_little_endian_two_bytes_per_sample():
    data = af.pcm16_bytes(np.array([0.25, -0.25], dtype=np.float64))
    assert data == struct.pack("<hh", 8192, -8192)


@pytest.mark.parametrize("bad", [np.zeros((2, 10), np.float32), np.zeros(10, np.int16)])
def test_pcm16_rejects_non_mono_or_non_float(bad):
    with pytest.raises(ValueError):
        af.pcm16_bytes(bad)


def test_full_wav_reads_back_with_soundfile():
    audio = _tone()
    data = af.wav_bytes(audio)
    assert len(data) == 44 + 2 * audio.size
    read, rate = sf.read(io.BytesIO(data), dtype="float32")
    info = sf.info(io.BytesIO(data))
    assert (rate, info.channels, info.subtype, info.frames) == (RATE, 1, "PCM_16", audio.size)
    assert np.max(np.abs(read - audio)) <= 2 * STEP


def test_full_wav_header_fields_agree_with_the_stdlib_reader():
    audio = _tone(0.1)
    with wave.open(io.BytesIO(af.wav_bytes(audio, 16000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, audio.size)
    data = af.wav_bytes(audio)
    sizes = struct.unpack_from("<I", data, 4)[0], struct.unpack_from("<I", data, 40)[0]  # RIFF, data
    assert sizes == (36 + 2 * audio.size, 2 * audio.size)


def test_empty_audio_makes_a_valid_empty_wav():
    data = af.wav_bytes(af.concat([]))
    assert len(data) == 44
    assert sf.info(io.BytesIO(data)).frames == 0


def test_streaming_wav_is_header_of_unknown_length_then_raw_chunks():
    chunks = [_tone(0.08, 300), _tone(0.08, 500), _tone(0.02, 700)]
    header = af.streaming_wav_header()
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack_from("<I", header, 4)[0] == 0xFFFFFFFF  # RIFF size: unknown
    assert header[36:40] == b"data" and struct.unpack_from("<I", header, 40)[0] == 0xFFFFFFFF
    body = header + b"".join(af.pcm16_bytes(c) for c in chunks)
    # Same header as a complete WAV apart from the two sizes.
    full = af.wav_bytes(af.concat(chunks))
    assert header[8:40] == full[8:40] and body[44:] == full[44:]
    read, rate = sf.read(io.BytesIO(body), dtype="float32")
    assert rate == RATE
    assert read.shape == (sum(c.size for c in chunks),)
    assert np.max(np.abs(read - af.concat(chunks))) <= 2 * STEP


def test_streaming_wav_reads_with_the_stdlib_reader_until_the_body_ends():
    audio = _tone(0.05)
    body = af.streaming_wav_header() + af.pcm16_bytes(audio)
    with wave.open(io.BytesIO(body)) as w:
        frames = w.readframes(10**9)
    assert frames == af.pcm16_bytes(audio)


def test_pcm_chunks_concatenate_to_the_pcm_of_the_whole():
    chunks = [_tone(0.03, 200), _tone(0.05, 400)]
    assert b"".join(af.pcm16_bytes(c) for c in chunks) == af.pcm16_bytes(af.concat(chunks))
    raw, rate = sf.read(io.BytesIO(af.pcm16_bytes(af.concat(chunks))), samplerate=RATE, channels=1,
                        format="RAW", subtype="PCM_16", endian="LITTLE", dtype="float32")
    assert np.max(np.abs(raw - af.concat(chunks))) <= 2 * STEP


@pytest.mark.parametrize("rate", [0, -1, 24000.0, True, 2**31])
def test_bad_sample_rates_are_refused(rate):
    with pytest.raises(ValueError):
        af.wav_header(rate)


def test_odd_or_oversized_data_lengths_are_refused():
    for size in (-2, 3, 0xFFFFFFFF):
        with pytest.raises(ValueError):
            af.wav_header(RATE, size)
