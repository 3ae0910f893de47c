"""The 503 path: a request the engine's scheduler rejects is answered 503 + Retry-After before any audio or header.

No server: the endpoint's route runs on FastAPI's test client with a fake service, and `SpeechService.synthesize`
with a fake engine client that finishes the request the way the scheduler adapter does.
"""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

pytest.importorskip("vllm")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from vllm_voxserve.config import VoxServeConfig  # noqa: E402
from vllm_voxserve.entrypoints import speech_plugin  # noqa: E402
from vllm_voxserve.entrypoints.edge_admission import EdgeGuard  # noqa: E402
from vllm_voxserve.entrypoints.rank_choice import RankChoice  # noqa: E402
from vllm_voxserve.entrypoints.speech_request import SpeechRequest  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import (  # noqa: E402
    Overloaded,
    SpeechService,
    SynthesisError,
    expected_frames,
)
from vllm_voxserve.contract import encode_rejection  # noqa: E402
from vllm_voxserve.transport import AudioReceiver  # noqa: E402

BODY = {"input": "Hello there.", "voice": "ryan"}


class FakeService:
    """What the route needs of SpeechService: prepare() and synthesize()."""

    refusal_at_arrival = SpeechService.refusal_at_arrival

    def __init__(self, outcome):
        self.outcome = outcome  # a list of chunks, or an exception raised before the first chunk
        self.config = VoxServeConfig()
        self.ranks = RankChoice(1)

    def prepare(self, request):
        return None, [0], None

    async def synthesize(self, job, prompt_ids, params, usage=None):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        for chunk in self.outcome:
            yield chunk


def client(outcome) -> TestClient:
    app = FastAPI()
    speech_plugin.SpeechEndpointPlugin().attach_router(app)
    app.state.voxserve_speech = FakeService(outcome)
    app.state.voxserve_edge = EdgeGuard.from_policy(VoxServeConfig().scheduler_policy())
    return TestClient(app)


@pytest.mark.parametrize("stream", [True, False])
def test_rejected_request_is_a_503_with_retry_after_and_a_message(stream):
    overloaded = Overloaded("server at capacity: first audio predicted after 260 ms (target 200 ms)", 1.2)
    response = client(overloaded).post("/v1/audio/speech", json={**BODY, "stream": stream})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "2"  # whole seconds, rounded up
    error = response.json()["error"]
    assert error["code"] == 503 and error["type"] == "service_unavailable"
    assert "first audio predicted after 260 ms" in error["message"]


def test_failure_before_the_first_chunk_is_a_500():
    response = client(SynthesisError("engine error: boom")).post("/v1/audio/speech", json={**BODY, "stream": True})
    assert response.status_code == 500 and "boom" in response.json()["error"]["message"]


def test_accepted_stream_still_streams_every_chunk():
    chunks = [np.full(1920, 0.5, np.float32), np.full(1920, -0.5, np.float32)]
    response = client(chunks).post("/v1/audio/speech", json={**BODY, "stream": True, "response_format": "pcm"})
    assert response.status_code == 200
    assert len(response.content) == 2 * 1920 * 2  # both chunks, as 16-bit PCM


def test_past_the_edge_limit_an_arrival_is_refused_before_the_service_sees_it():
    import time

    from prometheus_client import REGISTRY, generate_latest

    from tests.entrypoints.prometheus_text import sample_value
    from vllm_voxserve.scheduler.concurrency_limit import LimitSettings

    def refusals() -> float:
        text = generate_latest(REGISTRY).decode()
        return sample_value(text, "vllm:voxserve_requests_refused_total", reason="api_server_limit") or 0.0

    test_client = client([np.zeros(1920, np.float32)])
    service = test_client.app.state.voxserve_speech
    seen = []
    service.prepare = lambda request: seen.append(request) or (None, [0], None)
    edge = test_client.app.state.voxserve_edge = EdgeGuard(LimitSettings(0.2, floor=1, min_late=1), retry_after_s=2.5)
    now = time.monotonic()
    earlier = [edge.admit(now - 3.0), edge.admit(now - 2.9)]  # two in progress: above the floor, a busy server
    busy = edge.admit(now - 2.0)  # and one whose first audio came late: the next look cuts to 0.9 of 3
    busy.first_audio(now - 1.5)
    before = refusals()
    response = test_client.post("/v1/audio/speech", json={**BODY, "stream": True})
    assert response.status_code == 503 and response.headers["Retry-After"] == "3"
    assert "3 requests in progress at this API server" in response.json()["error"]["message"]
    assert seen == [] and refusals() == before + 1
    for ticket in (*earlier, busy):  # room again: the next request streams
        ticket.done(time.monotonic())
    response = test_client.post("/v1/audio/speech", json={**BODY, "stream": True, "response_format": "pcm"})
    assert response.status_code == 200 and len(response.content) == 1920 * 2 and len(seen) == 1
    assert edge.in_progress == 0


def test_while_the_engine_refuses_for_its_requests_in_progress_an_arrival_is_refused_before_it_is_read():
    """The engine's in-progress limit refused a request at as many streams open here as now: the next arrival is
    answered 503 at once, unread and unsent, as the API server's own refusal; once a stream ends it goes through."""
    import time

    from prometheus_client import REGISTRY, generate_latest

    from tests.entrypoints.prometheus_text import sample_value

    def refusals(reason: str) -> float:
        text = generate_latest(REGISTRY).decode()
        return sample_value(text, "vllm:voxserve_requests_refused_total", reason=reason) or 0.0

    test_client = client([np.zeros(1920, np.float32)])
    service = test_client.app.state.voxserve_speech
    seen = []
    service.prepare = lambda request: seen.append(request) or (None, [0], None)
    for _ in range(3):
        service.ranks.opened(0)
    service.ranks.opened(0)
    service.ranks.refused(0, time.monotonic(), retry_after_s=1.0, by_limit=True)  # at 3 open streams
    before = refusals("api_server_limit"), refusals("overloaded")
    response = test_client.post("/v1/audio/speech", json={**BODY, "stream": True})
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "3 requests in progress at this API server" in response.json()["error"]["message"]
    assert seen == [] and test_client.app.state.voxserve_edge.in_progress == 0
    assert (refusals("api_server_limit"), refusals("overloaded")) == (before[0] + 1, before[1])
    service.ranks.closed(0)  # a stream ended: the engine has room again
    response = test_client.post("/v1/audio/speech", json={**BODY, "stream": True, "response_format": "pcm"})
    assert response.status_code == 200 and len(seen) == 1


@pytest.mark.parametrize("outcome", [Overloaded("busy", 1.0), SynthesisError("boom"), [np.zeros(1920, np.float32)]])
@pytest.mark.parametrize("stream", [True, False])
def test_every_answer_ends_the_requests_admission_ticket(outcome, stream):
    test_client = client(outcome)
    test_client.post("/v1/audio/speech", json={**BODY, "stream": stream})
    test_client.post("/v1/audio/speech", json={"input": ""})  # 400
    assert test_client.app.state.voxserve_edge.in_progress == 0


@pytest.mark.parametrize("stream", [True, False])
def test_an_answers_first_audio_reaches_the_load_line_and_a_refusal_leaves_none(stream):
    test_client = client([np.zeros(1920, np.float32)])
    test_client.post("/v1/audio/speech", json={**BODY, "stream": stream})
    first = test_client.app.state.voxserve_edge.take_first_audio_s()
    assert len(first) == 1 and 0.0 <= first[0] < 10.0
    test_client.app.state.voxserve_speech.outcome = Overloaded("busy", 1.0)
    assert test_client.post("/v1/audio/speech", json={**BODY, "stream": stream}).status_code == 503
    assert test_client.app.state.voxserve_edge.take_first_audio_s() == []


class RejectingEngine:
    """Finishes every request as the scheduler adapter does for a rejected one: abort, stop_reason = rejection."""

    async def generate(self, prompt, params, request_id):
        yield types.SimpleNamespace(finished=False, outputs=[])  # an earlier, unfinished output is not a rejection
        stop = encode_rejection(3.4, "server at capacity: streams in progress need more")
        yield types.SimpleNamespace(finished=True, outputs=[types.SimpleNamespace(stop_reason=stop, token_ids=[])])


def test_service_turns_the_schedulers_rejection_into_overloaded():
    async def run():
        service = SpeechService.__new__(SpeechService)  # no checkpoint needed for synthesize()
        service.engine_client = RejectingEngine()
        service.ranks = RankChoice(1)
        service.receiver = AudioReceiver()
        service.start()
        job = types.SimpleNamespace(stream_key="k1", ref_audio=b"")
        try:
            with pytest.raises(Overloaded) as caught:
                async for _ in service.synthesize(job, [0], None):
                    pass
        finally:
            await service.receiver.aclose()
        return caught.value

    rejected = asyncio.run(run())
    assert rejected.retry_after_s == pytest.approx(3.4)
    assert "streams in progress" in str(rejected)


def test_expected_frames_is_exact_for_fixed_length_and_estimated_from_words_otherwise():
    assert expected_frames(SpeechRequest(input="a b c", ignore_eos=True, max_new_tokens=31)) == 30
    assert expected_frames(SpeechRequest(input="one two three four five")) == 26  # 5 words * 5.2
    assert expected_frames(SpeechRequest(input="word " * 1000, max_new_tokens=100)) == 99  # capped by max tokens


@pytest.mark.server
@pytest.mark.slow
def test_real_server_rejects_what_cannot_meet_its_slo_and_serves_a_looser_one(tmp_path):
    import json

    import requests

    from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny-custom-voice")
    voxserve = {"voxserve": {"ttfa_slo_ms": 1}}  # a server default no request can meet once the server is busy
    loose = {"ttfa_slo_ms": 60_000}  # the largest target a request may set
    body = {"model": SERVED_NAME, "voice": "ryan", "ignore_eos": True, "response_format": "pcm"}
    with speech_server(checkpoint, log_path=tmp_path / "serve-overload.log",
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        speech = f"{url}/v1/audio/speech"
        busy = requests.post(speech, json={**body, **loose, "input": "A long one.", "max_new_tokens": 1900,
                                           "stream": True}, stream=True, timeout=300)
        try:
            assert busy.status_code == 200  # idle server: admitted although 1 ms is out of reach
            audio = busy.iter_content(4096)  # kept: dropping the iterator would close the connection (an abort)
            next(audio)  # audio flowing: the server is busy
            strict = requests.post(speech, json={**body, "input": "Too late.", "max_new_tokens": 8}, timeout=300)
            assert strict.status_code == 503
            assert int(strict.headers["Retry-After"]) >= 1
            assert "first audio predicted" in strict.json()["error"]["message"]
            relaxed = requests.post(speech, json={**body, **loose, "input": "In time.", "max_new_tokens": 8},
                                    timeout=300)
            assert relaxed.status_code == 200 and len(relaxed.content) == 7 * 1920 * 2
        finally:
            busy.close()


class FinishingEngine:
    """vLLM with FINAL_ONLY outputs: one output, when the request finished, holding every token; late on purpose,
    after the request's audio has ended on the audio channel."""

    def __init__(self, delay_s: float, tokens: int):
        self.delay_s, self.tokens = delay_s, tokens

    async def generate(self, prompt, params, request_id):
        await asyncio.sleep(self.delay_s)
        completion = types.SimpleNamespace(token_ids=list(range(self.tokens)), stop_reason=None, finish_reason="stop")
        yield types.SimpleNamespace(finished=True, outputs=[completion])


def test_the_usage_comes_from_the_final_output_even_when_it_trails_the_audio():
    from vllm_voxserve.entrypoints.speech_service import SpeechUsage
    from vllm_voxserve.transport import AudioSender

    async def run():
        service = SpeechService.__new__(SpeechService)
        service.engine_client = FinishingEngine(delay_s=0.3, tokens=12)
        service.ranks = RankChoice(1)
        service.receiver = AudioReceiver()
        service.start()
        sender = AudioSender()
        job, usage = types.SimpleNamespace(stream_key="k2", ref_audio=b""), SpeechUsage()
        try:
            stream = service.synthesize(job, [0] * 7, None, usage)
            first = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.05)  # the stream is open: its audio and END come before the engine's output
            sender.send_audio(service.receiver.address, "k2", 0, np.zeros(1920, np.float32))
            sender.send_end(service.receiver.address, "k2", 1)
            chunks = [await first] + [chunk async for chunk in stream]
        finally:
            sender.close()
            await service.receiver.aclose()
        return chunks, usage

    chunks, usage = asyncio.run(run())
    assert len(chunks) == 1 and usage.as_dict() == {"input_tokens": 7, "output_tokens": 12, "total_tokens": 19}
