"""Switching a live CPU server's codec mode over HTTP (`/voxserve/modes`, `/voxserve/mode`) and streaming in it."""

from __future__ import annotations

import concurrent.futures
import json
import time

import numpy as np
import pytest
import requests

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server
from vllm_voxserve.contract import MODE_RPC_METHOD

pytestmark = [pytest.mark.server, pytest.mark.slow]

SAMPLES_PER_FRAME = 1920
JOB = dict(model=SERVED_NAME, input="Switching codec modes.", voice="ryan", seed=7, max_new_tokens=31,
           ignore_eos=True, response_format="pcm", stream=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-modes.log"
    # Overload shedding off: the CPU is slow enough that concurrent requests would be answered 503 by design.
    voxserve = {"voxserve": {"admin_routes": True, "scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, spelling="env", log_path=log,
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def stream_pcm(url: str, **fields) -> tuple[np.ndarray, int]:
    """The streamed audio as int16 samples, and how many network chunks it came in."""
    with requests.post(f"{url}/v1/audio/speech", json={**JOB, **fields}, stream=True, timeout=300) as response:
        assert response.status_code == 200, response.text
        pieces = [piece for piece in response.iter_content(None) if piece]
    return np.frombuffer(b"".join(pieces), dtype="<i2"), len(pieces)


def modes(url: str) -> dict:
    response = requests.get(f"{url}/voxserve/modes", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def switch(url: str, mode: str) -> requests.Response:
    return requests.post(f"{url}/voxserve/mode", json={"mode": mode}, timeout=120)


def test_switching_to_lanes_streams_the_same_audio(server):
    assert MODE_RPC_METHOD == "voxserve_codec_mode"  # the name the API server's routes call
    listed = ["inline", "lanes", "vllm-stock", "inline+prefill_first", "lanes+prefill_first"]
    assert modes(server) == {"modes": listed, "current": "inline", "ranks": 1}
    inline, _ = stream_pcm(server)
    jobs = [dict(seed=20 + i, max_new_tokens=14 + 6 * i, voice=v) for i, v in enumerate(["vivian", "aiden", "eric"])]
    inline_alone = [stream_pcm(server, **job)[0] for job in jobs]
    response = switch(server, "lanes")
    assert response.status_code == 200, response.text
    assert response.json()["current"] == "lanes"
    assert modes(server)["current"] == "lanes"
    try:
        lanes, pieces = stream_pcm(server)
        assert len(lanes) == 30 * SAMPLES_PER_FRAME  # 31 tokens -> 30 frames
        assert pieces > 1  # streamed chunk by chunk
        assert np.abs(lanes).max() > 0
        # Same codes through the same codec state: only float rounding of differently sized batches may differ.
        assert np.abs(lanes.astype(np.int32) - inline.astype(np.int32)).max() <= 2
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # chunks of several requests share batches
            together = list(pool.map(lambda job: stream_pcm(server, **job)[0], jobs))
        for job, alone, both in zip(jobs, inline_alone, together, strict=True):
            assert len(both) == len(alone) == (job["max_new_tokens"] - 1) * SAMPLES_PER_FRAME
            assert np.abs(both.astype(np.int32) - alone.astype(np.int32)).max() <= 2, job
    finally:
        assert switch(server, "inline").status_code == 200


def test_vllm_stock_mode_serves_the_same_audio_under_vllms_scheduler(server):
    """`vllm-stock`: vLLM's own scheduling with the codec inline, switched live (the ablation baseline). Its 409
    while busy is the same check as the codec modes' (below) plus the scheduler's (tests/scheduler)."""
    inline, _ = stream_pcm(server)
    response = switch(server, "vllm-stock")
    assert response.status_code == 200, response.text
    assert response.json()["current"] == "vllm-stock" and modes(server)["current"] == "vllm-stock"
    try:
        stock, _ = stream_pcm(server)
        assert np.abs(stock.astype(np.int32) - inline.astype(np.int32)).max() <= 2  # scheduling, not content
        long, pieces = stream_pcm(server, max_new_tokens=200)
        assert len(long) == 199 * SAMPLES_PER_FRAME and pieces > 1  # a long request runs to its end, streamed
    finally:
        answer = switch(server, "inline")
        assert answer.status_code == 200, answer.text
    assert modes(server)["current"] == "inline"


def test_an_admission_mode_serves_the_same_audio_and_a_plain_name_goes_back(server):
    """`inline+prefill_first`: the paper's ablation of deadline-aware admission, switched live."""
    inline, _ = stream_pcm(server)
    response = switch(server, "inline+prefill_first")
    assert response.status_code == 200, response.text
    assert modes(server)["current"] == "inline+prefill_first"
    try:
        fifo, _ = stream_pcm(server)
        assert np.abs(fifo.astype(np.int32) - inline.astype(np.int32)).max() <= 2  # scheduling, not content
    finally:
        answer = switch(server, "inline")
        assert answer.status_code == 200, answer.text
    assert modes(server)["current"] == "inline"


def test_bad_mode_is_a_400_and_a_busy_server_a_409(server):
    assert switch(server, "time_sharing").status_code == 400
    unknown = switch(server, "inline+fifo")
    assert unknown.status_code == 400 and "fifo" in unknown.json()["error"]["message"]
    json_type = {"Content-Type": "application/json"}
    assert requests.post(f"{server}/voxserve/mode", data=b"{", headers=json_type, timeout=30).status_code == 400
    assert requests.post(f"{server}/voxserve/mode", data={"mode": "lanes"}, timeout=30).status_code == 415
    # ~300 frames run for seconds on this CPU: the switch arrives while the request is running.
    response = requests.post(f"{server}/v1/audio/speech", json={**JOB, "max_new_tokens": 300}, stream=True,
                             timeout=300)
    assert response.status_code == 200
    chunks = response.iter_content(4096)
    next(chunks)  # audio is flowing
    busy = switch(server, "lanes")
    assert busy.status_code == 409, busy.text
    assert "running" in busy.json()["error"]["message"]
    assert modes(server)["current"] == "inline"
    response.close()  # abort it; once the worker has finished it the switch goes through
    deadline = time.monotonic() + 60
    while (answer := switch(server, "lanes")).status_code == 409:
        assert time.monotonic() < deadline, "the aborted request never left the worker"
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text
    assert switch(server, "inline").status_code == 200
