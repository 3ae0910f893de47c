"""Base checkpoints: voice cloning from a reference clip through the real server (CPU)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import requests
import soundfile

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]


def wav_b64(audio: np.ndarray, rate: int) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def base_server(tmp_path_factory, voices_dir):
    ckpt = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base", kind="base")
    voxserve = {"voxserve": {"voices_dir": str(voices_dir), "max_voices": 2}}
    with speech_server(ckpt, log_path=tmp_path_factory.mktemp("logs") / "serve-base.log",
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def reference_clip() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(np.arange(24000 * 2) * 2 * np.pi * 180 / 24000)
            + 0.05 * rng.standard_normal(48000)).astype(np.float32)


def clone(url: str, **fields) -> requests.Response:
    reference = reference_clip()
    body = {"model": SERVED_NAME, "input": "Cloned speech.", "task_type": "Base",
            "ref_audio": wav_b64(reference, 24000), "ref_text": "A reference sentence.", "response_format": "pcm",
            "max_new_tokens": 9, "ignore_eos": True, "seed": 5, **fields}
    return requests.post(f"{url}/v1/audio/speech", json=body, timeout=300)


def test_icl_and_x_vector_cloning_stream_audio(base_server):
    for fields in ({}, {"x_vector_only_mode": True, "ref_text": None}):
        response = clone(base_server, **fields)
        assert response.status_code == 200, response.text
        pcm = np.frombuffer(response.content, dtype="<i2")
        assert len(pcm) == 8 * 1920 and np.abs(pcm).max() > 0


def test_cloning_inputs_are_checked(base_server):
    assert "ref_text" in clone(base_server, ref_text=None).json()["error"]["message"]
    other_rate = wav_b64(0.3 * np.sin(np.arange(16000) * 2 * np.pi * 180 / 16000).astype(np.float32), 16000)
    resampled = clone(base_server, ref_audio=other_rate)  # a 16 kHz clip is resampled, not refused
    assert resampled.status_code == 200 and len(resampled.content) == 8 * 1920 * 2, resampled.text[:200]
    not_audio = clone(base_server, ref_audio=base64.b64encode(b"not a sound file").decode())
    assert not_audio.status_code == 400 and "ref_audio" in not_audio.json()["error"]["message"]
    no_ref = requests.post(f"{base_server}/v1/audio/speech", timeout=60,
                           json={"model": SERVED_NAME, "input": "Hi.", "task_type": "Base"})
    assert no_ref.status_code == 400 and "ref_audio" in no_ref.json()["error"]["message"]
    assert requests.get(f"{base_server}/health", timeout=10).status_code == 200


def test_uploaded_voices_are_listed_used_by_name_and_deleted(base_server, voices_dir):
    clip = base64.b64decode(wav_b64(reference_clip(), 24000))
    upload = {"name": "narrator", "ref_text": "A reference sentence.", "consent": "true"}
    created = requests.post(f"{base_server}/v1/audio/voices", data=upload, timeout=120,
                            files={"audio": ("narrator.wav", clip, "audio/wav")})
    assert created.status_code == 200, created.text
    assert created.json()["kind"] == "uploaded" and (voices_dir / "narrator" / "ref_codes.npy").exists()
    x_only = requests.post(f"{base_server}/v1/audio/voices", timeout=120,
                           data={"name": "whisper", "x_vector_only_mode": "true", "consent": "true"},
                           files={"audio": ("w.wav", clip, "audio/wav")})
    assert x_only.status_code == 200, x_only.text
    full = requests.post(f"{base_server}/v1/audio/voices", data={**upload, "name": "third"}, timeout=60,
                         files={"audio": ("t.wav", clip, "audio/wav")})
    assert full.status_code == 400 and "max_voices" in full.json()["error"]["message"]
    listed = requests.get(f"{base_server}/v1/audio/voices", timeout=10).json()
    assert listed["voices"] == ["narrator", "whisper"] and listed["uploads"] is True
    assert {d["name"]: d["kind"] for d in listed["details"]} == {"narrator": "uploaded", "whisper": "uploaded"}
    for name in ("narrator", "whisper"):
        spoken = requests.post(f"{base_server}/v1/audio/speech", timeout=300, json={
            "model": SERVED_NAME, "input": "Cloned speech.", "voice": name, "response_format": "pcm",
            "max_new_tokens": 9, "ignore_eos": True, "seed": 5})
        assert spoken.status_code == 200, spoken.text
        assert len(spoken.content) == 8 * 1920 * 2
    # the stored voice gives the audio the same clip gives when sent with the request (encoded once, not per request)
    by_clip = clone(base_server)
    by_name = requests.post(f"{base_server}/v1/audio/speech", timeout=300, json={
        "model": SERVED_NAME, "input": "Cloned speech.", "voice": "narrator", "task_type": "Base",
        "response_format": "pcm", "max_new_tokens": 9, "ignore_eos": True, "seed": 5})
    assert by_name.content == by_clip.content
    assert requests.delete(f"{base_server}/v1/audio/voices/narrator", timeout=30).status_code == 200
    gone = requests.post(f"{base_server}/v1/audio/speech", timeout=60, json={
        "model": SERVED_NAME, "input": "Hi.", "voice": "narrator", "response_format": "pcm"})
    assert gone.status_code == 400 and "voice 'narrator' is not an uploaded voice" in gone.json()["error"]["message"]
    assert not (voices_dir / "narrator").exists()
    assert requests.delete(f"{base_server}/v1/audio/voices/whisper", timeout=30).status_code == 200
