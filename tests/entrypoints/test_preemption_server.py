"""A CPU server whose KV cache holds fewer tokens than its concurrent requests need: vLLM preempts some of them and
recomputes them later; each still gets the audio it gets alone (its frames replayed, its code-predictor state kept)."""

from __future__ import annotations

import concurrent.futures
import json
import re

import numpy as np
import pytest
import requests

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

SAMPLES_PER_FRAME = 1920
# The tiny talker keeps 1 KiB of K/V per token (2 layers x K,V x 1 head x 64 x fp32): 448 tokens fit, each request
# below needs about 190 (prompt + 160 frames), so three at once cannot all stay in the cache.
KV_BYTES = 448 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-preemption.log"
    voxserve = {"voxserve": {"scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, log_path=log, extra_args=(
            "--additional-config", json.dumps(voxserve), "--max-model-len", "256",
            "--kv-cache-memory-bytes", str(KV_BYTES),
            # small steps: a recomputation spans several chunks, whose ends must not replace the kept stash
            "--max-num-batched-tokens", "64")) as url:
        yield url


def speech(url: str, **fields) -> np.ndarray:
    body = {"model": SERVED_NAME, "language": "english", "response_format": "pcm", "ignore_eos": True,
            "max_new_tokens": 161, "temperature": 0, "subtalker_temperature": 0, **fields}
    response = requests.post(f"{url}/v1/audio/speech", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2").astype(np.int32)


def preemptions(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=30).text
    return sum(float(v) for v in re.findall(r"^vllm:num_preemptions_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def test_preempted_requests_resume_and_get_the_audio_they_get_alone(server):
    jobs = [dict(input=f"Sentence {i} is about something else.", voice=v) for i, v in
            enumerate(["ryan", "vivian", "aiden"])]
    alone = [speech(server, **job) for job in jobs]
    before = preemptions(server)
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: speech(server, **job), jobs))
    assert preemptions(server) > before, "the KV cache was large enough: nothing was preempted"
    for job, a, b in zip(jobs, alone, together, strict=True):
        assert len(b) == len(a) == 160 * SAMPLES_PER_FRAME, job
        assert np.abs(a - b).max() <= 2, job
