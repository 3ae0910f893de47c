"""The speech route's bodies on FastAPI's test client with a fake service (no engine): OpenAI's SSE events, a stream
that fails midway, and whole files at another speed."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

pytest.importorskip("vllm")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from tests.entrypoints.audio_decoding import decode  # noqa: E402
from vllm_voxserve.config import VoxServeConfig  # noqa: E402
from vllm_voxserve.entrypoints import speech_plugin  # noqa: E402
from vllm_voxserve.entrypoints.edge_admission import EdgeGuard  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import SynthesisError  # noqa: E402

BODY = {"input": "Hello there.", "voice": "ryan"}
FRAME = 1920


class FakeService:
    """prepare() and synthesize() of SpeechService: `chunks` in order, then `error` raised if given."""

    def __init__(self, chunks, error: Exception | None = None, tokens_per_chunk: int = 10):
        self.chunks, self.error, self.tokens_per_chunk = chunks, error, tokens_per_chunk
        self.config = VoxServeConfig()
        self.served_models = ["tiny"]

    def refusal_at_arrival(self, now):
        return None

    def prepare(self, request):
        return None, [0] * 7, None

    async def synthesize(self, job, prompt_ids, params, usage=None):
        usage.input_tokens = len(prompt_ids)
        for chunk in self.chunks:
            usage.output_tokens += self.tokens_per_chunk
            yield chunk
        if self.error is not None:
            raise self.error


def client(service) -> TestClient:
    app = FastAPI()
    speech_plugin.SpeechEndpointPlugin().attach_router(app)
    app.state.voxserve_speech = service
    app.state.voxserve_edge = EdgeGuard.from_policy(service.config.scheduler_policy())
    return TestClient(app)


def tone_chunks(count: int) -> list[np.ndarray]:
    t = np.arange(count * 10 * FRAME) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    return np.split(audio, count)


def events(text: str) -> list[dict]:
    assert text.endswith("\n\n")
    return [json.loads(block.removeprefix("data: ")) for block in text.strip().split("\n\n")]


@pytest.mark.parametrize("fmt", ["pcm", "mp3", "opus"])
def test_sse_sends_base64_audio_deltas_then_done_with_the_usage(fmt):
    response = client(FakeService(tone_chunks(3))).post(
        "/v1/audio/speech", json={**BODY, "stream_format": "sse", "response_format": fmt})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    sent = events(response.text)
    assert [e["type"] for e in sent[:-1]] == ["speech.audio.delta"] * (len(sent) - 1) and len(sent) >= 4
    assert sent[-1] == {"type": "speech.audio.done",
                        "usage": {"input_tokens": 7, "output_tokens": 30, "total_tokens": 37}}
    audio = b"".join(base64.b64decode(e["audio"]) for e in sent[:-1])
    _, rate, samples = decode(fmt, audio)
    assert rate == 24000 and abs(samples - 30 * FRAME) < FRAME


def test_sse_that_fails_midway_ends_with_an_error_event_not_done():
    service = FakeService(tone_chunks(2), error=SynthesisError("worker lost"))
    response = client(service).post("/v1/audio/speech", json={**BODY, "stream_format": "sse",
                                                                 "response_format": "pcm"})
    sent = events(response.text)
    assert [e["type"] for e in sent] == ["speech.audio.delta", "speech.audio.delta", "error"]
    assert "worker lost" in sent[-1]["error"]["message"]


@pytest.mark.parametrize("speed", [0.5, 1.25, 4.0])
def test_a_whole_file_at_another_speed_has_its_length_divided_by_it(speed):
    response = client(FakeService(tone_chunks(2))).post(
        "/v1/audio/speech", json={**BODY, "speed": speed, "response_format": "flac"})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/flac"
    _, rate, samples = decode("flac", response.content)
    assert rate == 24000 and abs(samples - 20 * FRAME / speed) < FRAME
