"""`WS /v1/audio/speech/stream` on FastAPI's test client with a fake text-stream service (no engine)."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

pytest.importorskip("vllm")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from tests.entrypoints.audio_decoding import decode  # noqa: E402
from tests.entrypoints.fake_text_stream import FRAME, FRAMES_PER_WORD, FakeTextService  # noqa: E402
from vllm_voxserve.entrypoints import speech_plugin, speech_socket  # noqa: E402
from vllm_voxserve.entrypoints.edge_admission import EdgeGuard  # noqa: E402
from vllm_voxserve.entrypoints.request_guard import api_key_hashes  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import Overloaded, SynthesisError  # noqa: E402

PATH = "/v1/audio/speech/stream"
CONFIG = {"type": "config", "voice": "ryan"}
WORD_BYTES = FRAMES_PER_WORD * FRAME * 2  # one word's pcm


def app_for(service, api_key: str | None = None) -> FastAPI:
    app = FastAPI()
    speech_plugin.SpeechEndpointPlugin().attach_router(app)
    app.state.voxserve_speech = service
    app.state.voxserve_edge = EdgeGuard.from_policy(service.config.scheduler_policy())
    app.state.voxserve_api_keys = api_key_hashes([api_key] if api_key else None, None)
    return app


@contextlib.contextmanager
def utterance_socket(app: FastAPI, text: str, then: str):
    """A socket to `app` on which an utterance has been opened with `CONFIG` and `text`, followed by a message of
    type `then` (`flush`, `cancel` or `end`)."""
    with TestClient(app) as client, client.websocket_connect(PATH) as ws:
        ws.send_json(CONFIG)
        ws.send_json({"type": "text", "text": text})
        ws.send_json({"type": then})
        yield ws


def receive_until(ws, event_type: str | None = None) -> tuple[list, int | None]:
    """What the server sends (dicts for JSON events, bytes for audio) up to an event of `event_type`, or to the close
    (then the close code is returned too)."""
    got = []
    while True:
        message = ws.receive()
        if message["type"] == "websocket.close":
            return got, message.get("code")
        got.append(message["bytes"] if message.get("bytes") is not None else json.loads(message["text"]))
        if event_type is not None and isinstance(got[-1], dict) and got[-1]["type"] == event_type:
            return got, None


def audio_of(got: list) -> tuple[bytes, float]:
    """The audio bytes and the sum of the `audio` events' durations; every binary message follows its event."""
    data, duration = b"", 0.0
    for i, item in enumerate(got):
        if isinstance(item, bytes):
            assert got[i - 1]["type"] == "audio"
            data += item
        elif item["type"] == "audio":
            assert isinstance(got[i + 1], bytes)
            duration += item["duration_s"]
    return data, duration


def test_a_session_sends_words_and_gets_their_audio_then_done_and_a_normal_close():
    service = FakeTextService()
    with TestClient(app_for(service)) as client, client.websocket_connect(PATH) as ws:
        ws.send_json(CONFIG)
        for word in ("Hello ", "there, ", "world."):
            ws.send_json({"type": "text", "text": word})
        ws.send_json({"type": "end"})
        got, code = receive_until(ws)
    assert code == 1000
    assert got[0] == {"type": "started", "utterance": 1, "response_format": "pcm", "sample_rate": 24000}
    assert [e["index"] for e in got if isinstance(e, dict) and e["type"] == "audio"] == [0, 1, 2]
    assert got[-1] == {"type": "done", "utterance": 1, "reason": "end",
                       "usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}
    data, duration = audio_of(got)
    assert len(data) == 3 * WORD_BYTES and duration == pytest.approx(3 * FRAMES_PER_WORD * 0.08)
    stream = service.streams[0]
    assert "".join(stream.text) == "Hello there, world." and stream.request.input == ""
    assert stream.calls[-1] == "end" and stream.audio_closed


def receive_pieces(ws, count: int) -> list:
    """Events and audio until `count` binary messages have come."""
    got = []
    while sum(isinstance(item, bytes) for item in got) < count:
        more, code = receive_until(ws, "audio")
        assert code is None, more
        got += more + [ws.receive_bytes()]
    return got


def test_flush_speaks_what_has_arrived_and_keeps_the_utterance_open():
    service = FakeTextService()
    with TestClient(app_for(service)) as client, client.websocket_connect(PATH) as ws:
        ws.send_json({**CONFIG, "response_format": "wav"})
        ws.send_json({"type": "text", "text": "One two "})
        ws.send_json({"type": "flush"})
        first = receive_pieces(ws, 2)  # the flushed words' audio comes before any more text
        ws.send_json({"type": "text", "text": "three."})
        ws.send_json({"type": "end"})
        rest, code = receive_until(ws)
    assert code == 1000 and first[0]["type"] == "started" and rest[-1]["reason"] == "end"
    assert service.streams[0].calls == ["append", "flush", "append", "end"]
    data, _ = audio_of(first + rest)
    assert data[:4] == b"RIFF" and len(data) == 44 + 3 * WORD_BYTES


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus", "aac"])
def test_every_streamed_format_decodes(fmt):
    service = FakeTextService()
    with TestClient(app_for(service)) as client, client.websocket_connect(PATH) as ws:
        ws.send_json({**CONFIG, "response_format": fmt})
        ws.send_json({"type": "text", "text": "one two three four"})
        ws.send_json({"type": "end"})
        got, code = receive_until(ws)
    assert code == 1000 and got[-1]["type"] == "done"
    data, duration = audio_of(got)
    _, rate, samples = decode(fmt, data)
    assert rate == 24000 and duration == pytest.approx(4 * FRAMES_PER_WORD * 0.08)
    assert abs(samples - 4 * FRAMES_PER_WORD * FRAME) < 2 * FRAME  # a codec's priming and padding at most


def test_cancel_stops_the_utterance_and_the_next_starts_with_the_same_or_a_new_config():
    service = FakeTextService()
    with utterance_socket(app_for(service), "never spoken", "cancel") as ws:
        first, _ = receive_until(ws, "done")
        ws.send_json({"type": "text", "text": "same voice"})
        ws.send_json({"type": "flush"})
        second = receive_pieces(ws, 2)
        ws.send_json({"type": "cancel"})
        second += receive_until(ws, "done")[0]
        ws.send_json({**CONFIG, "voice": "vivian", "seed": 3})
        ws.send_json({"type": "text", "text": "new voice"})
        ws.send_json({"type": "end"})
        third, code = receive_until(ws)
    assert [e["type"] for e in first] == ["started", "done"] and first[-1]["reason"] == "cancelled"
    assert second[0] == {**first[0], "utterance": 2} and second[-1]["reason"] == "cancelled"
    assert third[0]["utterance"] == 3 and third[-1]["reason"] == "end" and code == 1000
    assert [s.request.voice for s in service.streams] == ["ryan", "ryan", "vivian"]
    assert service.streams[2].request.seed == 3
    assert all(s.cancelled.is_set() and s.audio_closed for s in service.streams[:2])


@pytest.mark.parametrize("first, then, code, named", [
    (None, b"\x00\x01", 1003, "binary messages"),
    (None, "{not json", 1008, "message is not valid JSON"),
    (None, {"type": "text", "text": "hi"}, 1008, "type: the first message must be a config"),
    (None, {"type": "config", "temperature": 9}, 1008, "temperature"),
    (None, {"type": "config", "input": "hi"}, 1008, "input: not a config field"),
    (None, {"type": "config", "voice": "nobody"}, 1008, "voice 'nobody'"),  # refused when the utterance opens
    (CONFIG, {"type": "text", "text": "a forbidden word"}, 1008, "text: 'forbidden'"),
    (CONFIG, {"type": "text", "text": "bell \u0007"}, 1008, "text contains the control character U+0007"),
    (CONFIG, {"type": "shout"}, 1008, "type: 'shout'"),
])
def test_a_bad_message_gets_an_error_event_naming_it_then_a_close_code(first, then, code, named):
    service = FakeTextService()
    app = app_for(service)
    with TestClient(app) as client, client.websocket_connect(PATH) as ws:
        if first is not None:
            ws.send_json(first)
        if isinstance(then, bytes):
            ws.send_bytes(then)
        elif isinstance(then, str):
            ws.send_text(then)
        else:
            ws.send_json(then)
            if then.get("type") == "config" and "voice" in then:
                ws.send_json({"type": "text", "text": "hi"})
        got, closed = receive_until(ws)
    assert closed == code
    error = got[-1]
    assert error["type"] == "error" and error["error"]["message"].startswith(named), error
    assert app.state.voxserve_edge.in_progress == 0
    assert all(s.cancelled.is_set() for s in service.streams)


def test_the_api_key_is_required_when_the_server_has_one():
    service = FakeTextService()
    app = app_for(service, api_key="sesame")
    with TestClient(app) as client:
        with client.websocket_connect(PATH) as ws:
            got, code = receive_until(ws)
        assert code == 1008 and got[0]["error"]["type"] == "authentication_error"
        with client.websocket_connect(PATH, headers={"Authorization": "Bearer wrong"}) as ws:
            assert receive_until(ws)[1] == 1008
        with client.websocket_connect(PATH, headers={"Authorization": "Bearer sesame"}) as ws:
            ws.send_json(CONFIG)
            ws.send_json({"type": "text", "text": "let me in"})
            ws.send_json({"type": "end"})
            got, code = receive_until(ws)
        assert code == 1000 and got[-1]["type"] == "done"
    assert len(service.streams) == 1


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_client_that_leaves_mid_utterance_cancels_it_at_once():
    service = FakeTextService()
    app = app_for(service)
    with TestClient(app) as client:
        with client.websocket_connect(PATH) as ws:
            ws.send_json(CONFIG)
            ws.send_json({"type": "text", "text": "one two three"})
            ws.send_json({"type": "flush"})
            receive_pieces(ws, 1)
            assert app.state.voxserve_edge.in_progress == 1
        wait_for(lambda: service.streams[0].cancelled.is_set())
        wait_for(lambda: service.streams[0].audio_closed and app.state.voxserve_edge.in_progress == 0)


@pytest.mark.parametrize("error, code, kind", [
    (SynthesisError("worker lost"), 1011, "server_error"),
    (Overloaded("server at capacity", 2.5), 1013, "service_unavailable"),
])
def test_a_synthesis_that_fails_ends_with_an_error_event_and_its_close_code(error, code, kind):
    service = FakeTextService(fail_after_chunks=1, error=error)
    app = app_for(service)
    with utterance_socket(app, "one two three", "end") as ws:
        got, closed = receive_until(ws)
    assert closed == code and sum(isinstance(item, bytes) for item in got) == 1
    assert got[-1]["error"]["type"] == kind and str(error) in got[-1]["error"]["message"]
    if isinstance(error, Overloaded):
        assert got[-1]["error"]["retry_after_s"] == 2.5
    assert app.state.voxserve_edge.in_progress == 0


def test_an_utterance_the_engine_would_refuse_is_refused_at_once_and_the_socket_closes_try_again_later():
    service = FakeTextService()
    service.engine_full = ("server at capacity: 3 requests in progress at this API server", 0.2)
    app = app_for(service)
    with utterance_socket(app, "one two three", "end") as ws:
        got, closed = receive_until(ws)
    assert closed == 1013 and got[-1]["error"]["type"] == "service_unavailable"
    assert "at this API server" in got[-1]["error"]["message"] and got[-1]["error"]["retry_after_s"] == 0.2
    assert service.streams == [] and app.state.voxserve_edge.in_progress == 0


def test_an_utterance_that_runs_out_leaves_the_socket_open_for_the_next():
    service = FakeTextService()
    with utterance_socket(app_for(service), "short", "flush") as ws:
        receive_pieces(ws, 1)
        ws.portal.call(service.streams[0].run_out)  # its audio ends as at max_new_tokens
        got, _ = receive_until(ws, "done")
        assert got[-1]["reason"] == "stopped"
        ws.send_json({"type": "text", "text": "again"})
        ws.send_json({"type": "end"})
        got, code = receive_until(ws)
    assert got[0]["utterance"] == 2 and code == 1000


@pytest.mark.parametrize("constant, config_first", [("CONFIG_TIMEOUT_S", False), ("IDLE_TIMEOUT_S", True)])
def test_a_socket_left_unused_is_closed(monkeypatch, constant, config_first):
    monkeypatch.setattr(speech_socket, constant, 0.3)
    service = FakeTextService()
    with TestClient(app_for(service)) as client, client.websocket_connect(PATH) as ws:
        if config_first:
            ws.send_json(CONFIG)
            ws.send_json({"type": "text", "text": "and then nothing"})
        got, code = receive_until(ws)
    assert code == 1008 and "in 0.3 s" in got[-1]["error"]["message"]
    assert all(s.cancelled.is_set() for s in service.streams)
