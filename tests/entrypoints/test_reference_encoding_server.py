"""Encoding a reference clip does not stall other streams (CPU server, tiny Base checkpoint).

The server runs with the test-only slow-encoder hook (`vllm_voxserve.fault_injection`): every reference encoding
takes SLOW_S seconds longer. While a second clone request's reference encodes, a stream already playing keeps
receiving audio: the encoding runs beside the engine's step loop, not in it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import numpy as np
import pytest
import requests

from tests.entrypoints.test_voice_clone_server import wav_b64
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server
from vllm_voxserve.fault_injection import SLOW_REFERENCE_ENV

pytestmark = [pytest.mark.server, pytest.mark.slow]

SLOW_S = 8.0


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    ckpt = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base", kind="base")
    # short chunks: the playing stream's audio comes often, even on a busy CPU; no shedding (this CPU misses the
    # TTFA target anyway)
    voxserve = {"voxserve": {"first_chunk_frames": 2, "chunk_frames": 2, "scheduler": {"overload_mode": "off"}}}
    with speech_server(ckpt, log_path=tmp_path_factory.mktemp("logs") / "serve-slow-reference.log",
                       env={SLOW_REFERENCE_ENV: str(SLOW_S)},
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def clone(url: str, stream: bool, **fields) -> requests.Response:
    reference = (0.3 * np.sin(np.arange(24000) * 2 * np.pi * 180 / 24000)).astype(np.float32)
    body = {"model": SERVED_NAME, "input": "Cloned speech.", "task_type": "Base", "x_vector_only_mode": True,
            "ref_audio": wav_b64(reference, 24000), "response_format": "pcm", "ignore_eos": True, "seed": 5,
            "stream": stream, **fields}
    return requests.post(f"{url}/v1/audio/speech", json=body, stream=stream, timeout=300)


def test_a_slow_reference_encoding_leaves_other_streams_playing(base_server):
    playing = clone(base_server, stream=True, max_new_tokens=1900)  # about a minute of CPU work
    assert playing.status_code == 200
    arrivals: list[float] = []
    stop = threading.Event()

    def listen():
        with contextlib.suppress(requests.RequestException, AttributeError):  # closed by the test
            for _ in playing.iter_content(chunk_size=None):
                arrivals.append(time.monotonic())
                if stop.is_set():
                    break

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    while not arrivals:
        time.sleep(0.05)
    sent = time.monotonic()
    second = clone(base_server, stream=False, max_new_tokens=5)
    answered = time.monotonic()
    stop.set()
    assert second.status_code == 200, second.text
    assert answered - sent >= SLOW_S  # its reference did take that long
    during = [t for t in arrivals if sent <= t <= sent + SLOW_S]
    times = [sent, *during, sent + SLOW_S]
    # the playing stream got audio all along (had the encoding held the step loop, none would come meanwhile)
    assert len(during) >= 3 and max(b - a for a, b in zip(times, times[1:])) < SLOW_S / 2, (during, sent)
    playing.close()
