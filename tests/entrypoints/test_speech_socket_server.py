"""`WS /v1/audio/speech/stream` on a real CPU server (tiny checkpoint, API key set): words sent with pauses become
audio, flush, cancel then a new utterance, bad messages (the server stays healthy), the key, clients that leave,
and the README's client."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.entrypoints.audio_decoding import decode
from tests.entrypoints.prometheus_text import engine_gauges
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

websockets = pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEY = "socket-test-key"
FRAME_BYTES = 1920 * 2  # one 80 ms frame of pcm
CONFIG = {"type": "config", "model": SERVED_NAME, "voice": "ryan", "response_format": "pcm", "ignore_eos": True,
          "seed": 0}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-socket.log"
    voxserve = {"voxserve": {"scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, log_path=log, extra_args=("--api-key", KEY, "--additional-config",
                                                             json.dumps(voxserve))) as url:
        yield url


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def open_socket(url: str, key: str | None = KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return connect(ws_url(url), additional_headers=headers, open_timeout=60, max_size=None)


def send(ws, **message) -> None:
    ws.send(json.dumps(message))


def receive(ws, until: str | None = None, timeout_s: float = 300) -> tuple[list, int | None]:
    """Events (dicts) and audio (bytes) up to an event of type `until`, or to the close (and its code)."""
    got = []
    try:
        while True:
            message = ws.recv(timeout=timeout_s)
            got.append(message if isinstance(message, bytes) else json.loads(message))
            if until is not None and isinstance(got[-1], dict) and got[-1]["type"] == until:
                return got, None
    except ConnectionClosed as closed:
        return got, closed.rcvd.code if closed.rcvd is not None else None


def receive_audio(ws, pieces: int) -> list:
    got = []
    while sum(isinstance(item, bytes) for item in got) < pieces:
        more, code = receive(ws, "audio")
        assert code is None, more
        got += more + [ws.recv(timeout=300)]
    return got


def audio_bytes(got: list) -> int:
    return sum(len(item) for item in got if isinstance(item, bytes))


def wait_idle(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (values := engine_gauges(url)) != {name: 0.0 for name in values}:
        assert time.monotonic() < deadline, f"work left {timeout_s:g} s after: {values}"
        time.sleep(0.5)


def test_words_sent_with_pauses_become_the_utterances_audio(server):
    with open_socket(server) as ws:
        send(ws, **CONFIG, max_new_tokens=16)
        for word in ("Hello ", "there, ", "slow ", "world."):
            send(ws, type="text", text=word)
            time.sleep(0.3)
        send(ws, type="end")
        got, code = receive(ws)
    assert code == 1000, got[-1]
    assert got[0] == {"type": "started", "utterance": 1, "response_format": "pcm", "sample_rate": 24000}
    done = got[-1]
    assert done["type"] == "done" and done["reason"] == "end" and done["usage"]["output_tokens"] >= 15
    events = [item for item in got if isinstance(item, dict) and item["type"] == "audio"]
    assert [e["index"] for e in events] == list(range(len(events))) and len(events) > 1
    assert audio_bytes(got) == 15 * FRAME_BYTES
    assert sum(e["duration_s"] for e in events) == pytest.approx(15 * 0.08)


def test_flush_speaks_what_has_arrived_and_the_utterance_goes_on(server):
    with open_socket(server) as ws:
        # the flushed words outnumber the first chunk's frames, and the frames outnumber all the text's tokens
        send(ws, **CONFIG, max_new_tokens=24)
        send(ws, type="text", text="One two three four five six seven eight nine ten eleven twelve")
        send(ws, type="flush")
        first = receive_audio(ws, 1)  # before any more text
        send(ws, type="text", text=" and thirteen.")
        send(ws, type="end")
        rest, code = receive(ws)
    assert code == 1000 and first[0]["type"] == "started" and rest[-1]["reason"] == "end"
    assert audio_bytes(first + rest) == 23 * FRAME_BYTES


def test_cancel_then_a_new_utterance_on_the_same_socket(server):
    with open_socket(server) as ws:
        send(ws, **CONFIG, max_new_tokens=1000)
        send(ws, type="text", text="A long utterance that will be cut short by its listener.")
        send(ws, type="flush")
        receive_audio(ws, 1)
        send(ws, type="cancel")
        cancelled, _ = receive(ws, "done")
        assert cancelled[-1]["reason"] == "cancelled"
        send(ws, type="text", text="The same config again, for a second utterance.")
        send(ws, type="flush")
        second = receive_audio(ws, 1)
        assert second[0]["type"] == "started" and second[0]["utterance"] == 2
        send(ws, type="cancel")
        assert receive(ws, "done")[0][-1]["reason"] == "cancelled"
        send(ws, **CONFIG, max_new_tokens=13)  # a new config
        send(ws, type="text", text="Short.")
        send(ws, type="end")
        got, code = receive(ws)
    assert code == 1000 and got[0]["utterance"] == 3 and got[-1]["reason"] == "end"
    assert audio_bytes(got) == 12 * FRAME_BYTES
    wait_idle(server)


# each: what the client sends, the close code, and what the error event's message names
BAD_MESSAGES = [
    ([b"\x00binary"], 1003, "binary messages"),
    (["{not json"], 1008, "message is not valid JSON"),
    ([{"type": "config", "temperature": 7}], 1008, "temperature"),
    ([{"type": "text", "text": "no config"}], 1008, "type: the first message must be a config"),
    ([{**CONFIG, "voice": "nobody"}, {"type": "text", "text": "hi "}], 1008, "unknown speaker 'nobody'"),
    ([{**CONFIG, "max_new_tokens": 1000}, {"type": "text", "text": "hi"}, {"type": "config"}], 1008,
     "type: a config message cannot come"),
]


def test_bad_messages_get_an_error_event_and_a_close_code_and_the_server_stays_healthy(server):
    for messages, code, named in BAD_MESSAGES:
        with open_socket(server) as ws:
            for message in messages:
                ws.send(message if isinstance(message, (bytes, str)) else json.dumps(message))
            got, closed = receive(ws)
        assert closed == code and got[-1]["type"] == "error", (named, got)
        assert named in got[-1]["error"]["message"], (named, got[-1])
    # checked once after them all: a bad message that broke the server fails it as surely as one check per message
    assert requests.get(f"{server}/health", timeout=10).status_code == 200
    response = requests.post(f"{server}/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"},
                             json={"input": "Still here.", "voice": "ryan", "response_format": "pcm",
                                   "max_new_tokens": 6, "ignore_eos": True}, timeout=120)
    assert response.status_code == 200 and len(response.content) == 5 * FRAME_BYTES
    wait_idle(server)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_the_api_key_is_refused_at_the_handshake(server, key):
    with pytest.raises(InvalidStatus) as refused:
        open_socket(server, key)
    assert refused.value.response.status_code == 401


def test_clients_that_leave_mid_utterance_free_everything(server):
    for i in range(4):
        ws = open_socket(server)
        send(ws, **{**CONFIG, "seed": i}, max_new_tokens=1000)
        send(ws, type="text", text="A client that will not stay to listen to all of this.")
        if i % 2:
            send(ws, type="end")
        else:
            send(ws, type="flush")
        receive_audio(ws, 1)
        ws.close()  # mid-utterance: hundreds of frames left
    wait_idle(server)
    metrics = requests.get(f"{server}/metrics", timeout=10).text
    running = re.search(r'^vllm:voxserve_running_streams\{[^}]*\} (\S+)$', metrics, re.M)
    assert running is not None and float(running.group(1)) == 0.0


def test_the_readme_client_runs(server, tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- socket-example:start -->\n```python\n(.*?)```\n<!-- socket-example:end -->", readme,
                     re.S).group(1)
    # the server of this module has an API key: the header the example's comment names
    code = code.replace("connect(url)", f"connect(url, additional_headers={{'Authorization': 'Bearer {KEY}'}})")
    result = subprocess.run([sys.executable, "-c", code, ws_url(server)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "started" and events[-1]["type"] == "done"
    audio, rate, samples = decode("wav", (tmp_path / "socket.wav").read_bytes())
    assert rate == 24000 and samples == 25 * 1920 and np.abs(audio).max() > 0
