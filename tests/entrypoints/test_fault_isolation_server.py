"""One request failing inside the worker's step ends that request alone (CPU server, tiny checkpoint).

The server runs with the test-only fault hook (`vllm_voxserve.fault_injection`): the worker raises while it writes
the step rows of the request with seed FAULTED, once it has a few frames. Of 8 concurrent non-streaming requests, that
one is answered HTTP 500 with the error; the other 7 get the same audio as when they run without it (greedy sampling:
batch-independent, and one chunk per codec call); the server stays healthy and serves the next request.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server
from vllm_voxserve.fault_injection import FAULT_ENV

pytestmark = [pytest.mark.server, pytest.mark.slow]

SEEDS = tuple(range(1001, 1009))
FAULTED = 1004


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-fault.log"
    # One chunk per codec call: a chunk's audio then depends on its codes alone, not on which chunks share its batch
    # (batched float sums round differently), so equal codes give byte-identical audio.
    voxserve = {"voxserve": {"scheduler": {"overload_mode": "off"}}, "voxserve_internal": {"max_codec_batch": 1}}
    with speech_server(checkpoint, log_path=log, env={FAULT_ENV: f"step:{FAULTED}:3"},
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def speak(url: str, seed: int, **fields) -> requests.Response:
    body = {"model": SERVED_NAME, "input": "Each request on its own.", "voice": "ryan", "response_format": "pcm",
            "max_new_tokens": 16, "ignore_eos": True, "seed": seed, "temperature": 0, "subtalker_temperature": 0,
            **fields}
    return requests.post(f"{url}/v1/audio/speech", json=body, timeout=300)


def together(url: str, seeds) -> dict[int, requests.Response]:
    with ThreadPoolExecutor(len(seeds)) as pool:
        return dict(zip(seeds, pool.map(lambda seed: speak(url, seed), seeds)))


def running(url: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vllm:num_requests_running not in /metrics")


def test_a_request_failing_in_the_step_ends_alone_and_the_others_keep_their_audio(server):
    with_fault = together(server, SEEDS)
    failed = with_fault.pop(FAULTED)
    assert failed.status_code == 500, failed.text
    assert "injected step fault" in failed.json()["error"]["message"]
    assert all(r.status_code == 200 for r in with_fault.values()), [r.text for r in with_fault.values()]
    without_fault = together(server, tuple(with_fault))
    for seed, response in with_fault.items():
        assert len(response.content) == 15 * 1920 * 2
        assert response.content == without_fault[seed].content, f"seed {seed}: audio changed by the fault"
    assert requests.get(f"{server}/health", timeout=10).status_code == 200
    assert speak(server, 7).status_code == 200
    deadline = time.monotonic() + 20
    while running(server) > 0:  # the failed request was finished, not left to run
        assert time.monotonic() < deadline, "a request is still running"
        time.sleep(0.5)


def test_a_seed_outside_the_signed_64_bit_range_never_ends_the_server(server):
    for seed in (2**63, 2**64 - 1):
        response = speak(server, seed)
        assert response.status_code != 200 and response.status_code < 600, response.text
        assert requests.get(f"{server}/health", timeout=10).status_code == 200
    assert speak(server, 9).status_code == 200
