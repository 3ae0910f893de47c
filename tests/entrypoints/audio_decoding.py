"""Decoders for the response formats that are not the server's encoder: libsndfile (through soundfile) reads mp3,
Ogg/Opus, FLAC and WAV; AAC, which libsndfile does not read, is decoded by FAAD2 (`faad`, which scripts/test.sh
installs where it can) after its ADTS frame headers are walked, or checked from those headers alone without it."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile

import numpy as np
import soundfile
import soxr

ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
AAC_FRAME_SAMPLES = 1024


def adts_frames(data: bytes) -> tuple[int, int]:
    """(sample rate, frames) from walking the ADTS headers of an AAC stream; AssertionError where one is broken."""
    rates, frames, at = set(), 0, 0
    while at < len(data):
        header = data[at:at + 7]
        assert len(header) == 7 and header[0] == 0xFF and header[1] & 0xF0 == 0xF0, f"no ADTS sync at byte {at}"
        rates.add(ADTS_RATES[(header[2] >> 2) & 0x0F])
        length = ((header[3] & 0x03) << 11) | (header[4] << 3) | (header[5] >> 5)
        assert length >= 7, f"ADTS frame of {length} bytes at byte {at}"
        frames += (header[6] & 0x03) + 1
        at += length
    assert len(rates) == 1, rates
    return rates.pop(), frames


def decode(fmt: str, data: bytes, pcm_rate: int = 24000) -> tuple[np.ndarray | None, int, int]:
    """(samples or None for aac, sample rate, sample count) of a response body."""
    if fmt == "pcm":
        audio = np.frombuffer(data, "<i2").astype(np.float32) / 32768
        return audio, pcm_rate, len(audio)
    if fmt == "aac":
        rate, frames = adts_frames(data)
        if shutil.which("faad") is None:
            return None, rate, frames * AAC_FRAME_SAMPLES
        audio, faad_rate = faad_decode(data)
        if faad_rate != rate:  # FAAD2 assumes implicit SBR in low-rate AAC and plays it at twice the rate
            audio = soxr.resample(audio, faad_rate, rate).astype(np.float32)
        return audio, rate, len(audio)
    with soundfile.SoundFile(io.BytesIO(data)) as f:
        rate = f.samplerate
        # read block by block: a streamed FLAC or WAV says its length is unknown (the largest value or 0)
        blocks = [block for block in f.blocks(blocksize=4096, dtype="float32", always_2d=True)]
    audio = np.concatenate(blocks)[:, 0] if blocks else np.zeros(0, np.float32)
    return audio, rate, len(audio)


def faad_decode(data: bytes) -> tuple[np.ndarray, int]:
    """(mono samples, sample rate) of an ADTS AAC stream as FAAD2 decodes it."""
    with tempfile.TemporaryDirectory() as tmp:
        source, wav = f"{tmp}/in.aac", f"{tmp}/out.wav"
        with open(source, "wb") as f:
            f.write(data)
        subprocess.run(["faad", "-q", "-o", wav, source], check=True, capture_output=True)
        audio, rate = soundfile.read(wav, dtype="float32", always_2d=True)
    return audio.mean(axis=1), rate
