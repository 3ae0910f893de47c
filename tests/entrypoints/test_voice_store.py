"""Uploaded voices: kept on disk across restarts, names and limits checked, and the upload route's refusals (FastAPI's
test client, a fake service whose encoder returns fixed arrays)."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
import soundfile

from vllm_voxserve.entrypoints.voice_store import VoiceStore

X_VECTOR = np.arange(8, dtype=np.float32).tobytes()
CODES = np.arange(3 * 16, dtype=np.int32).tobytes()


def test_voices_survive_a_restart_and_deletes_remove_them(tmp_path):
    store = VoiceStore(tmp_path, max_voices=4)
    store.add("anna", "A reference sentence.", X_VECTOR, CODES, 3, reserved=set())
    store.add("ben-2", "", X_VECTOR, b"", 0, reserved=set())
    (tmp_path / ".upload-half").mkdir()  # an upload cut short: never a voice
    reopened = VoiceStore(tmp_path, max_voices=4)
    assert [v.name for v in reopened.list()] == ["anna", "ben-2"]
    anna = reopened.get("anna")
    assert anna.ref_codes == CODES and anna.x_vector == X_VECTOR and anna.num_ref_frames == 3
    assert not anna.x_vector_only and reopened.get("ben-2").x_vector_only
    assert anna.describe()["kind"] == "uploaded"
    assert reopened.delete("anna") and not reopened.delete("anna")
    assert [v.name for v in VoiceStore(tmp_path, 4).list()] == ["ben-2"]


@pytest.mark.parametrize("name, words", [
    ("Anna", "is not a voice name"), ("", "is not a voice name"), ("a" * 65, "is not a voice name"),
    ("../up", "is not a voice name"), ("ryan", "is taken"), ("anna", "is taken"),
])
def test_bad_or_taken_names_are_refused_naming_name(tmp_path, name, words):
    store = VoiceStore(tmp_path, max_voices=4)
    store.add("anna", "Text.", X_VECTOR, CODES, 3, reserved=set())
    with pytest.raises(ValueError, match=words) as info:
        store.check_new(name, reserved={"ryan"})
    assert str(info.value).startswith("name ")


def test_the_store_holds_at_most_max_voices(tmp_path):
    store = VoiceStore(tmp_path, max_voices=1)
    store.add("anna", "Text.", X_VECTOR, CODES, 3, reserved=set())
    with pytest.raises(ValueError, match="max_voices"):
        store.check_new("ben", reserved=set())


pytest.importorskip("vllm")


class FakeEncoder:
    async def encode_clip(self, audio: bytes, x_vector_only: bool):
        return X_VECTOR, b"" if x_vector_only else CODES


def client(tmp_path, max_voices: int = 4):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vllm_voxserve.config import VoxServeConfig
    from vllm_voxserve.entrypoints import speech_plugin

    service = types.SimpleNamespace(config=VoxServeConfig(max_ref_audio_bytes=200_000), references=FakeEncoder(),
                                    voice_store=VoiceStore(tmp_path, max_voices),
                                    tables=types.SimpleNamespace(speakers={}, model_type="base"))
    app = FastAPI()
    speech_plugin.SpeechEndpointPlugin().attach_router(app)
    app.state.voxserve_speech = service
    return TestClient(app), service


def wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, (0.2 * np.sin(np.arange(int(seconds * rate)) / 7)).astype(np.float32), rate, format="WAV")
    return out.getvalue()


GOOD = {"name": "anna", "ref_text": "A reference sentence.", "consent": "true"}


def test_an_upload_is_encoded_once_stored_and_deleted(tmp_path):
    test_client, service = client(tmp_path)
    response = test_client.post("/v1/audio/voices", data=GOOD, files={"audio": ("a.wav", wav(), "audio/wav")})
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "anna" and response.json()["kind"] == "uploaded"
    stored = service.voice_store.get("anna")
    assert stored.ref_codes == CODES and stored.num_ref_frames == 13  # 1 s at 24 kHz: 12.5 frames of 1920
    assert test_client.delete("/v1/audio/voices/anna").json() == {"name": "anna", "deleted": True}
    assert test_client.delete("/v1/audio/voices/anna").status_code == 404


@pytest.mark.parametrize("data, files, status, words", [
    ({**GOOD, "consent": "false"}, True, 400, "consent"),
    ({k: v for k, v in GOOD.items() if k != "consent"}, True, 400, "consent"),
    ({k: v for k, v in GOOD.items() if k != "name"}, True, 400, "name: Field required"),
    ({**GOOD, "name": "Not OK"}, True, 400, "name 'Not OK' is not a voice name"),
    ({**GOOD, "ref_text": ""}, True, 400, "ref_text"),
    ({**GOOD, "ref_text": "bad \x07 char"}, True, 400, "ref_text contains the control character"),
    ({**GOOD, "x_vector_only_mode": "maybe"}, True, 400, "x_vector_only_mode"),
    ({**GOOD, "speaker": "x"}, True, 400, "speaker: not a field"),
    (GOOD, False, 400, "audio: Field required"),
])
def test_bad_uploads_are_a_4xx_naming_the_field(tmp_path, data, files, status, words):
    test_client, service = client(tmp_path)
    response = test_client.post("/v1/audio/voices", data=data,
                                files={"audio": ("a.wav", wav(), "audio/wav")} if files else {"audio": (None, "text")})
    assert response.status_code == status and words in response.json()["error"]["message"], response.text
    assert service.voice_store.list() == []


def test_uploads_that_are_not_audio_too_long_or_too_many_are_refused(tmp_path):
    test_client, service = client(tmp_path, max_voices=1)
    not_audio = test_client.post("/v1/audio/voices", data=GOOD, files={"audio": ("a.wav", b"RIFF junk", "audio/wav")})
    assert not_audio.status_code == 400 and "audio could not be decoded" in not_audio.json()["error"]["message"]
    too_long = test_client.post("/v1/audio/voices", data=GOOD, files={"audio": ("a.wav", wav(31, 2000), "audio/wav")})
    assert too_long.status_code == 400 and "audio is 31.0 s long" in too_long.json()["error"]["message"]
    too_big = test_client.post("/v1/audio/voices", data=GOOD, files={"audio": ("a.wav", b"0" * 300_000, "audio/wav")})
    assert too_big.status_code == 413
    as_json = test_client.post("/v1/audio/voices", json=GOOD)
    assert as_json.status_code == 415 and "multipart/form-data" in as_json.json()["error"]["message"]
    assert test_client.post("/v1/audio/voices", data=GOOD,
                            files={"audio": ("a.wav", wav(), "audio/wav")}).status_code == 200
    full = test_client.post("/v1/audio/voices", data={**GOOD, "name": "ben"},
                            files={"audio": ("a.wav", wav(), "audio/wav")})
    assert full.status_code == 400 and "max_voices" in full.json()["error"]["message"]
