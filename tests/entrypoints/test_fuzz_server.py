"""A table of bad requests against one real CPU server started with an API key and the admin routes on: each gets a
4xx whose message names the field at fault, none a 5xx, and the server serves normally afterwards."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
import soundfile

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEY = "fuzz-table-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_CAP = 1 << 20  # the server's voxserve.max_request_bytes here: the oversized bodies stay quick to send
SAMPLES_PER_FRAME = 1920
GOOD = {"model": SERVED_NAME, "input": "Hello there.", "voice": "ryan", "max_new_tokens": 4, "ignore_eos": True,
        "response_format": "pcm"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-fuzz.log"
    voxserve = {"voxserve": {"admin_routes": True, "max_request_bytes": BODY_CAP,
                             "scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, spelling="env", log_path=log,
                       extra_args=("--api-key", KEY, "--additional-config", json.dumps(voxserve))) as url:
        yield url


@dataclass
class Case:
    name: str
    body: object = None  # a dict (sent as JSON over GOOD's fields), or bytes sent as they are
    expect: int = 400
    words: str = ""  # a substring of the error message: the field or rule at fault
    path: str = "/v1/audio/speech"
    method: str = "POST"
    headers: dict = field(default_factory=lambda: dict(AUTH))
    merge: bool = True  # dict bodies: over GOOD's fields (False: exactly this object)


def speech(name, words, expect=400, **fields) -> Case:
    return Case(name, fields, expect, words)


def raw(name, data: bytes, words, expect=400, path="/v1/audio/speech", content_type="application/json") -> Case:
    return Case(name, data, expect, words, path, headers={**AUTH, "Content-Type": content_type})


def wav_b64(seconds: float, rate: int = 8000) -> str:
    out = io.BytesIO()
    soundfile.write(out, np.zeros(int(seconds * rate), np.int16), rate, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


def nested(depth: int) -> bytes:
    return b'{"input": ' + b"[" * depth + b"]" * depth + b"}"


NO_KEY = {"Content-Type": "application/json"}
WRONG_KEY = {"Authorization": "Bearer not-the-key", "Content-Type": "application/json"}

CASES = [
    # model
    speech("model unknown", "model 'tts-1' is not served", model="tts-1"),
    speech("model not a string", "model", model=5),
    speech("model too long", "model", model="m" * 300),
    # input
    Case("input missing", {k: v for k, v in GOOD.items() if k != "input"}, 400, "input: Field required", merge=False),
    speech("input empty", "input must not be empty", input=""),
    speech("input only spaces", "input must not be empty", input="   \n "),
    speech("input only NULs", "input contains the control character U+0000", input="\x00\x00\x00"),
    speech("input only punctuation", "input has nothing to speak", input="?!... -- ;"),
    speech("input zero-width spaces", "input has nothing to speak", input="\u200b\u200b"),
    speech("input control char", "input contains the control character U+001B", input="Hello \x1b[31m there"),
    speech("input too long", "input is 4097 characters; at most 4096", input="a" * 4097),
    speech("input not a string", "input", input=42),
    speech("input a list", "input", input=["Hello"]),
    raw("input lone surrogate", b'{"input": "Hi \\ud800 there", "voice": "ryan"}', "input: is not valid Unicode"),
    raw("input lone low surrogate", b'{"input": "\\udc00", "voice": "ryan"}', "input: is not valid Unicode"),
    # voice
    speech("voice unknown", "unknown speaker", voice="alloy"),
    speech("voice missing", "voice is required", voice=None),
    speech("voice not a string", "voice", voice=7),
    speech("voice too long", "voice", voice="v" * 1000),
    raw("voice lone surrogate", b'{"input": "Hi", "voice": "\\ud83d"}', "voice: is not valid Unicode"),
    # response_format: every one that exists, with another field at fault, and ones that do not
    speech("wav with a bad seed", "seed", response_format="wav", seed=2**63),
    speech("pcm with a bad seed", "seed", response_format="pcm", seed=2**64 - 1),
    speech("wav streamed with bad top_k", "top_k", response_format="wav", stream=True, top_k=2**31),
    speech("pcm streamed with bad top_p", "top_p", response_format="pcm", stream=True, top_p=0),
    speech("mp3 with a bad seed", "seed", response_format="mp3", seed=2**63),
    speech("opus streamed with bad top_k", "top_k", response_format="opus", stream=True, top_k=-1),
    speech("aac streamed with a bad language", "language", response_format="aac", stream_format="audio",
           language="klingon"),
    speech("flac with a bad top_p", "top_p", response_format="flac", top_p=2),
    speech("flac streamed", "response_format 'flac' is for whole-file responses only", response_format="flac",
           stream=True),
    speech("flac as sse", "response_format 'flac' is for whole-file", response_format="flac", stream_format="sse"),
    speech("format ogg", "response_format 'ogg' is not supported", response_format="ogg"),
    speech("format mpeg", "response_format", response_format="mpeg"),
    speech("format WAV upper case", "response_format", response_format="WAV"),
    speech("format empty", "response_format", response_format=""),
    speech("format null", "response_format", response_format=None),
    speech("format number", "response_format", response_format=1),
    # speed
    speech("speed 4.5", "speed: Input should be less than or equal to 4", speed=4.5),
    speech("speed 0.2", "speed: Input should be greater than or equal to 0.25", speed=0.2),
    speech("speed 0", "speed", speed=0),
    speech("speed negative", "speed", speed=-1),
    speech("speed streamed", "speed 2 is only for whole-file responses", speed=2.0, stream=True),
    speech("speed as sse", "speed 0.5 is only for whole-file responses", speed=0.5, stream_format="sse"),
    speech("speed null", "speed", speed=None),
    speech("speed text", "speed", speed="fast"),
    raw("speed NaN", b'{"input": "Hi", "voice": "ryan", "speed": NaN}', "speed: NaN is not allowed"),
    # stream, stream_format
    speech("stream not a boolean", "stream", stream="maybe"),
    speech("stream_format unknown", "stream_format 'events' is not supported", stream_format="events"),
    speech("stream_format upper case", "stream_format 'SSE' is not supported", stream_format="SSE"),
    speech("stream_format sse with a bad seed", "seed", stream_format="sse", seed="x"),
    speech("stream_format number", "stream_format", stream_format=3),
    # instructions
    speech("instructions too long", "instructions is 4097 characters", instructions="b" * 4097),
    speech("instructions control char", "instructions contains the control character U+0007", instructions="a\x07"),
    speech("instructions not a string", "instructions", instructions={"tone": "calm"}),
    raw("instructions lone surrogate", b'{"input": "Hi", "voice": "ryan", "instructions": "\\udbff"}',
        "instructions: is not valid Unicode"),
    # task_type: every one, and others
    speech("task_type VoiceDesign", "needs a VoiceDesign checkpoint", task_type="VoiceDesign"),
    speech("task_type Base", "needs a Base checkpoint", task_type="Base"),
    speech("task_type CustomVoice, bad voice", "unknown speaker", task_type="CustomVoice", voice="nobody"),
    speech("task_type unknown", "task_type 'Podcast' is unknown", task_type="Podcast"),
    speech("task_type lower case", "task_type 'base' is unknown", task_type="base"),
    speech("task_type number", "task_type", task_type=2),
    # language
    speech("language unknown", "language", language="klingon"),
    speech("language too long", "language", language="x" * 500),
    speech("language number", "language", language=1),
    # ref_audio, ref_text, x_vector_only_mode (a CustomVoice server: reference clips are refused, but checked first)
    speech("ref_audio on CustomVoice", "ref_audio/ref_text are only for Base", ref_audio=wav_b64(1.0)),
    speech("ref_audio not base64", "ref_audio is not valid base64", ref_audio="not base64!!"),
    speech("ref_audio not audio", "ref_audio could not be decoded", ref_audio=base64.b64encode(b"RIFFjunk").decode()),
    speech("ref_audio over 30 s", "ref_audio is 31.0 s long; at most 30 s", ref_audio=wav_b64(31.0)),
    speech("ref_audio data URL without payload", "ref_audio data URL has no payload", ref_audio="data:audio/wav"),
    speech("ref_audio number", "ref_audio", ref_audio=12),
    speech("ref_text on CustomVoice", "ref_audio/ref_text are only for Base", ref_text="Some words."),
    speech("ref_text too long", "ref_text is 4097 characters", ref_text="r" * 4097),
    speech("x_vector_only_mode not a boolean", "x_vector_only_mode", x_vector_only_mode="maybe"),
    speech("non_streaming_mode not a boolean", "non_streaming_mode", non_streaming_mode=[True]),
    # sampling
    speech("temperature negative", "temperature", temperature=-0.5),
    speech("temperature over 2", "temperature", temperature=2.5),
    speech("temperature text", "temperature", temperature="hot"),
    raw("temperature NaN", b'{"input": "Hi", "voice": "ryan", "temperature": NaN}',
        "temperature: NaN is not allowed; numbers must be finite"),
    raw("temperature Infinity", b'{"input": "Hi", "voice": "ryan", "temperature": Infinity}',
        "temperature: Infinity is not allowed"),
    speech("top_k negative", "top_k", top_k=-1),
    speech("top_k past int32", "top_k", top_k=2**31),
    speech("top_k fraction", "top_k", top_k=1.5),
    speech("top_p zero", "top_p", top_p=0),
    speech("top_p over 1", "top_p", top_p=1.01),
    raw("top_p -Infinity", b'{"input": "Hi", "voice": "ryan", "top_p": -Infinity}', "top_p: -Infinity"),
    speech("repetition_penalty zero", "repetition_penalty", repetition_penalty=0),
    speech("repetition_penalty huge", "repetition_penalty", repetition_penalty=1e12),
    raw("repetition_penalty 1e999", b'{"input": "Hi", "voice": "ryan", "repetition_penalty": 1e999}',
        "repetition_penalty: Infinity"),
    speech("subtalker_temperature negative", "subtalker_temperature", subtalker_temperature=-1),
    speech("subtalker_temperature over 2", "subtalker_temperature", subtalker_temperature=9),
    speech("subtalker_top_k 0 while sampling", "subtalker_top_k", subtalker_top_k=0),
    speech("subtalker_top_k 65", "subtalker_top_k", subtalker_top_k=65),
    speech("subtalker_top_k past int32", "subtalker_top_k", subtalker_top_k=2**31),
    speech("subtalker_top_p zero", "subtalker_top_p", subtalker_top_p=0),
    speech("subtalker_top_p 2", "subtalker_top_p", subtalker_top_p=2),
    # seed: any signed 64-bit integer, nothing else
    speech("seed 2^63", "seed: Input should be less than or equal to 9223372036854775807", seed=2**63),
    speech("seed 2^64-1", "seed", seed=2**64 - 1),
    speech("seed -2^63-1", "seed: Input should be greater than or equal to -9223372036854775808", seed=-(2**63) - 1),
    speech("seed 10^30", "seed", seed=10**30),
    speech("seed fraction", "seed", seed=1.5),
    speech("seed text", "seed", seed="seven"),
    raw("seed 5000 digits", b'{"input": "Hi", "voice": "ryan", "seed": ' + b"9" * 5000 + b"}", "not valid JSON"),
    # length control
    speech("max_new_tokens 1", "max_new_tokens", max_new_tokens=1),
    speech("max_new_tokens negative", "max_new_tokens", max_new_tokens=-5),
    speech("max_new_tokens past 16384", "max_new_tokens", max_new_tokens=16385),
    speech("max_new_tokens past the context", "max_new_tokens 9000 does not fit", max_new_tokens=9000),
    speech("ignore_eos not a boolean", "ignore_eos", ignore_eos="maybe"),
    speech("ttfa_slo_ms zero", "ttfa_slo_ms", ttfa_slo_ms=0),
    speech("ttfa_slo_ms negative", "ttfa_slo_ms", ttfa_slo_ms=-10),
    speech("ttfa_slo_ms over a minute", "ttfa_slo_ms: Input should be less than or equal to 60000", ttfa_slo_ms=60001),
    raw("ttfa_slo_ms Infinity", b'{"input": "Hi", "voice": "ryan", "ttfa_slo_ms": Infinity}', "ttfa_slo_ms: Infinity"),
    # fields that do not exist
    speech("unknown field", "unknown_field: Extra inputs are not permitted", unknown_field=1),
    speech("field name in another case", "Model: Extra inputs", Model=SERVED_NAME),
    raw("field name lone surrogate", b'{"input": "Hi", "\\udfff": 1}', "a field name: is not valid Unicode"),
    # bodies that are not one JSON object
    raw("body an array", b'[{"input": "Hi"}]', "must be a JSON object, got an array"),
    raw("body a string", b'"Hello"', "must be a JSON object, got a string"),
    raw("body a number", b"42", "must be a JSON object, got a number"),
    raw("body null", b"null", "must be a JSON object, got null"),
    raw("body true", b"true", "must be a JSON object, got a boolean"),
    raw("body empty", b"", "request body is not valid JSON"),
    raw("body cut short", b'{"input": "Hi', "request body is not valid JSON"),
    raw("body form-encoded", b"input=Hello&voice=ryan", "request body is not valid JSON",
        content_type="application/x-www-form-urlencoded"),
    raw("body not UTF-8", '{"input": "Hi"}'.encode("utf-16"), "request body is not valid UTF-8"),
    raw("body latin-1 byte", b'{"input": "caf\xe9"}', "request body is not valid UTF-8"),
    raw("body nested 33 deep", nested(33), "nested deeper than 32 levels"),
    raw("body nested 100000 deep", nested(100_000), "nested deeper than 32 levels"),
    raw("body over the cap", b'{"input": "' + b"a" * BODY_CAP + b'"}', "max_request_bytes", expect=413),
    # the /v1 routes are vLLM's guarded prefix: the key is checked before our code runs
    Case("speech without the key", dict(GOOD), 401, "Unauthorized", headers=dict(NO_KEY)),
    Case("speech with a wrong key", dict(GOOD), 401, "Unauthorized", headers=dict(WRONG_KEY)),
    Case("voices without the key", None, 401, "Unauthorized", "/v1/audio/voices", "GET", headers={}),
    Case("voice upload without the key", b"", 401, "Unauthorized", "/v1/audio/voices", "POST",
         headers={"Content-Type": "multipart/form-data; boundary=x"}),
    Case("voice upload with a wrong key", b"", 401, "Unauthorized", "/v1/audio/voices", "POST",
         headers={**WRONG_KEY, "Content-Type": "multipart/form-data; boundary=x"}),
    Case("voice delete without the key", None, 401, "Unauthorized", "/v1/audio/voices/ryan", "DELETE", headers={}),
    raw("voice upload to a CustomVoice checkpoint", b"", "voices are uploaded to Base checkpoints", 404,
        "/v1/audio/voices", "multipart/form-data; boundary=x"),
    Case("voice delete of a speaker", None, 404, "name 'ryan' is not an uploaded voice", "/v1/audio/voices/ryan",
         "DELETE"),
    # admin routes: the key (ours to check: vLLM guards only /v1), then JSON only
    Case("modes without the key", None, 401, "API key", "/voxserve/modes", "GET", headers={}),
    Case("modes with a wrong key", None, 401, "not valid", "/voxserve/modes", "GET", headers=dict(WRONG_KEY)),
    Case("modes with another scheme", None, 401, "API key", "/voxserve/modes", "GET",
         headers={"Authorization": f"Basic {KEY}"}),
    Case("mode without the key", {"mode": "lanes"}, 401, "API key", "/voxserve/mode", headers=dict(NO_KEY),
         merge=False),
    Case("mode with a wrong key", {"mode": "lanes"}, 401, "not valid", "/voxserve/mode", headers=dict(WRONG_KEY),
         merge=False),
    Case("mode form post without the key", b"mode=vllm-stock", 401, "API key", "/voxserve/mode",
         headers={"Content-Type": "application/x-www-form-urlencoded"}),
    raw("mode form post with the key", b"mode=vllm-stock", "Content-Type must be application/json", 415,
        "/voxserve/mode", "application/x-www-form-urlencoded"),
    raw("mode as text/plain", b'{"mode": "lanes"}', "Content-Type must be application/json", 415, "/voxserve/mode",
        "text/plain"),
    Case("mode without a Content-Type", b'{"mode": "lanes"}', 415, "Content-Type", "/voxserve/mode"),
    raw("mode unknown", b'{"mode": "time_sharing"}', "unknown codec mode 'time_sharing'", path="/voxserve/mode"),
    raw("mode unknown admission", b'{"mode": "lanes+fifo"}', "admission mode 'fifo'", path="/voxserve/mode"),
    raw("mode not a string", b'{"mode": 5}', "mode: the request body must be", path="/voxserve/mode"),
    raw("mode missing", b"{}", "mode: the request body must be", path="/voxserve/mode"),
    raw("mode with an extra key", b'{"mode": "lanes", "x": 1}', "mode: the request body must be",
        path="/voxserve/mode"),
    raw("mode body an array", b'["lanes"]', "must be a JSON object", path="/voxserve/mode"),
    raw("mode body not JSON", b"{mode", "not valid JSON", path="/voxserve/mode"),
    raw("mode body nested", nested(1500), "nested deeper", path="/voxserve/mode"),
    raw("mode body over 4 KiB", b'{"mode": "' + b"l" * 5000 + b'"}', "at most 4096", 413, "/voxserve/mode"),
    raw("mode lone surrogate", b'{"mode": "\\ud800"}', "mode: is not valid Unicode", path="/voxserve/mode"),
]


def send(url: str, case: Case) -> requests.Response:
    if isinstance(case.body, dict):
        payload = {**GOOD, **case.body} if case.merge else case.body
        payload = {k: v for k, v in payload.items() if v is not None or k in case.body}
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **case.headers}
    else:
        data, headers = case.body, case.headers
    return requests.request(case.method, url + case.path, data=data, headers=headers, timeout=120)


def message_of(response: requests.Response) -> str:
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else str(error)


def raw_exchange(url: str, head: bytes, body_chunks: list[bytes]) -> tuple[int, bytes]:
    """Send a request over a bare socket (a lying Content-Length, or a chunked body), the body from a thread, and
    read the answer as it comes: the server may answer before the body is sent."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head)

        def send_body():
            try:
                for chunk in body_chunks:
                    sock.sendall(chunk)
            except OSError:  # the server answered and closed: the rest is not wanted
                pass

        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        answer = b""
        while b"\r\n\r\n" not in answer and (piece := sock.recv(65536)):
            answer += piece
        head_end = answer.index(b"\r\n\r\n") + 4
        length = next(int(line.split(b":", 1)[1]) for line in answer[:head_end].split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(answer) < head_end + length and (piece := sock.recv(65536)):
            answer += piece
    sender.join(timeout=30)  # the socket is closed: a send still blocked on it has failed by now
    return int(answer.split(b" ", 2)[1]), answer


def test_every_bad_request_is_a_4xx_naming_the_field_and_the_server_stays_healthy(server):
    assert len(CASES) >= 80 and len({c.name for c in CASES}) == len(CASES)
    covered = {k for c in CASES if isinstance(c.body, dict) for k in c.body}
    from vllm_voxserve.entrypoints.speech_request import SpeechRequest

    assert set(SpeechRequest.model_fields) <= covered  # every field of the schema has bad values in the table
    failures, statuses = [], {}
    for case in CASES:
        response = send(server, case)
        statuses[case.name] = response.status_code
        text = message_of(response) if response.headers.get("content-type", "").startswith("application/json") \
            else response.text
        if response.status_code != case.expect or case.words not in text:
            failures.append(f"{case.name}: {response.status_code} {text[:300]!r} (want {case.expect}, "
                            f"{case.words!r})")
    assert not [name for name, status in statuses.items() if status >= 500], statuses
    assert not failures, "\n".join(failures)
    assert requests.get(f"{server}/health", timeout=10).status_code == 200
    good = requests.post(f"{server}/v1/audio/speech", json=GOOD, headers=AUTH, timeout=120)
    assert good.status_code == 200, good.text
    assert len(good.content) == 2 * (GOOD["max_new_tokens"] - 1) * SAMPLES_PER_FRAME


def test_an_oversized_body_is_refused_from_its_headers_or_at_the_cap(server):
    host = urlsplit(server).netloc.encode()
    started = time.monotonic()
    lying = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer " + KEY.encode() +
             b"\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n")
    status, answer = raw_exchange(server, lying, [])  # no body follows: only the header can have refused it
    assert status == 413 and b"max_request_bytes" in answer, answer
    assert time.monotonic() - started < 30
    chunked = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer " + KEY.encode() +
               b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"a" * 65536
    body = [b"%x\r\n" % len(piece) + piece + b"\r\n"] * (2 * BODY_CAP // len(piece)) + [b"0\r\n\r\n"]
    status, answer = raw_exchange(server, chunked, body)
    assert status == 413 and b"max_request_bytes" in answer, answer


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
def test_the_extreme_64_bit_seeds_give_audio(server, seed):
    response = requests.post(f"{server}/v1/audio/speech", json={**GOOD, "seed": seed}, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    assert len(response.content) == 2 * (GOOD["max_new_tokens"] - 1) * SAMPLES_PER_FRAME
    assert requests.get(f"{server}/health", timeout=10).status_code == 200


def test_the_admin_routes_answer_with_the_key(server):
    modes = requests.get(f"{server}/voxserve/modes", headers=AUTH, timeout=30)
    assert modes.status_code == 200 and modes.json()["current"] == "inline"
    switched = requests.post(f"{server}/voxserve/mode", json={"mode": "inline"}, headers=AUTH, timeout=120)
    assert switched.status_code == 200, switched.text
