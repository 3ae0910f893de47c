"""Clients that leave free their work at once, streaming or not (CPU server, tiny checkpoint).

Hundreds of long requests (1,000 frames: minutes of CPU work each) are sent 8 at a time by clients that leave after
the first audio bytes (streaming) or after a short wait (non-streaming: the answer would come only at the end). Then
vLLM's gauges show nothing running and no KV cache in use, all of the worker's codec slots serve 8 new streams at
once, and a request streams as usual. A request left running would hold the gauges up for minutes.
"""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import numpy as np
import pytest
import requests

from tests.entrypoints.prometheus_text import engine_gauges
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

SLOTS = 8  # codec slots: as many as the clients at a time
LEAVERS = 104  # of each kind


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-disconnects.log"
    voxserve = {"voxserve": {"max_codec_slots": SLOTS, "scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, log_path=log, extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def body(**fields) -> bytes:
    return json.dumps({"model": SERVED_NAME, "input": "A client that will not stay to listen.", "voice": "ryan",
                       "response_format": "pcm", "max_new_tokens": 1000, "ignore_eos": True, **fields}).encode()


def send(url: str, payload: bytes) -> socket.socket:
    where = urlparse(url)
    sock = socket.create_connection((where.hostname, where.port), timeout=120)
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def leave_after_first_audio(url: str, i: int) -> bool:
    """Streaming: read the headers and the first audio bytes, then hang up."""
    with send(url, body(stream=True, seed=i)) as sock:
        received = b""
        while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < 64:
            piece = sock.recv(65536)
            if not piece:
                return False
            received += piece
        return received.startswith(b"HTTP/1.1 200")


def leave_while_waiting(url: str, i: int) -> bool:
    """Non-streaming: hang up before the answer (which would come after all 1,000 frames)."""
    with send(url, body(seed=i)) as sock:
        time.sleep(random.Random(i).uniform(0.05, 0.6))
        sock.setblocking(False)
        try:
            return not sock.recv(1)  # nothing came yet
        except BlockingIOError:
            return True


def stream(url: str, seed: int) -> list[bytes]:
    response = requests.post(f"{url}/v1/audio/speech", data=body(stream=True, seed=seed, max_new_tokens=25),
                             headers={"Content-Type": "application/json"}, stream=True, timeout=120)
    assert response.status_code == 200, response.text
    return list(response.iter_content(chunk_size=None))


def test_hundreds_of_clients_leaving_free_everything(server):
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        streaming = list(pool.map(lambda i: leave_after_first_audio(server, i), range(LEAVERS)))
        waiting = list(pool.map(lambda i: leave_while_waiting(server, i), range(LEAVERS)))
    assert all(streaming), f"{streaming.count(False)} streams ended before their first audio"
    assert all(waiting), f"{waiting.count(False)} non-streaming requests were answered before their clients left"
    deadline = time.monotonic() + 30
    while (values := engine_gauges(server)) != {name: 0.0 for name in values}:
        assert time.monotonic() < deadline, f"work left {time.monotonic() - started:.0f} s after {LEAVERS}x2 left: " \
                                            f"{values}"
        time.sleep(0.5)
    # every codec slot is free again: 8 streams at once get all of their audio
    with ThreadPoolExecutor(SLOTS) as pool:
        for pieces in pool.map(lambda seed: stream(server, seed), range(SLOTS)):
            assert len(np.frombuffer(b"".join(pieces), dtype="<i2")) == 24 * 1920
    pieces = stream(server, 99)
    assert len(pieces) > 1  # still streamed: audio came in more than one piece
