"""vLLM data parallelism on CPU: `--data-parallel-size 2` (two engine cores, each with its own scheduler and worker)
behind two API servers, against one engine behind two API servers (`--api-server-count 2`).

Seeded requests give the same bytes on both servers, whichever rank and API server take them; a request that rank 0
refuses (the test-only refusal, `fault_injection.REFUSE_ENV`) is served by rank 1 instead of being answered 503;
clients that leave free their rank's codec slots; the admin route hears both ranks.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from tests.entrypoints.test_disconnects_server import leave_after_first_audio
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server
from vllm_voxserve.fault_injection import REFUSE_ENV

pytestmark = [pytest.mark.server, pytest.mark.slow]

SEEDS = (1, 2, 3, 4)
REFUSED_SEED = 5  # rank 0 refuses this one
FRAMES = 24
SLOTS = 2  # codec slots per rank


def speech(url: str, seed: int) -> bytes:
    body = {"model": SERVED_NAME, "input": "Two ranks, one voice.", "voice": "ryan", "response_format": "pcm",
            "stream": True, "max_new_tokens": FRAMES + 1, "ignore_eos": True, "seed": seed}
    response = requests.post(f"{url}/v1/audio/speech", json=body, stream=True, timeout=300)
    assert response.status_code == 200, response.text
    return b"".join(response.iter_content(chunk_size=None))


def concurrently(url: str, seeds) -> dict[int, bytes]:
    with ThreadPoolExecutor(len(seeds)) as pool:
        return dict(zip(seeds, pool.map(lambda seed: speech(url, seed), seeds)))


def metric(url: str, name: str) -> float:
    """The sum of a series over its labels (engines, API servers)."""
    lines = requests.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.split("{", 1)[0].split(" ", 1)[0] == name)


def server_args(**voxserve) -> tuple[str, ...]:
    # one chunk per codec call: equal codes give byte-identical audio whatever else a rank decodes beside them
    config = {"voxserve": {"max_codec_slots": SLOTS, "admin_routes": True, "scheduler": {"overload_mode": "off"},
                           **voxserve}, "voxserve_internal": {"max_codec_batch": 1}}
    return ("--api-server-count", "2", "--additional-config", json.dumps(config))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")


@pytest.fixture(scope="module")
def one_engine_audio(checkpoint, tmp_path_factory):
    """Each seed's audio from one engine behind two API servers (the server stops before the two-rank one starts)."""
    log = tmp_path_factory.mktemp("logs") / "serve-one-engine.log"
    with speech_server(checkpoint, log_path=log, extra_args=server_args()) as url:
        audio = concurrently(url, SEEDS)
        audio[REFUSED_SEED] = speech(url, REFUSED_SEED)
    for seed, data in audio.items():
        assert len(data) == FRAMES * 1920 * 2, seed  # complete: every frame, 16-bit samples
    return audio


@pytest.fixture(scope="module")
def two_ranks(checkpoint, one_engine_audio, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "serve-two-ranks.log"
    with speech_server(checkpoint, log_path=log, env={REFUSE_ENV: f"0:{REFUSED_SEED}"},
                       extra_args=("--data-parallel-size", "2", *server_args())) as url:
        yield url


def test_two_ranks_stream_the_same_bytes_as_one_engine(two_ranks, one_engine_audio):
    for _ in range(2):  # twice: each API server's ranks take turns, so every seed meets both ranks
        heard = concurrently(two_ranks, SEEDS)
        for seed in SEEDS:
            assert heard[seed] == one_engine_audio[seed], f"seed {seed} differs"


def test_a_request_rank_0_refuses_is_served_by_rank_1(two_ranks, one_engine_audio):
    before = metric(two_ranks, "vllm:voxserve_rank_retries_total")
    for _ in range(6):  # each API server starts on the rank after its last: one of these tries rank 0 first
        assert speech(two_ranks, REFUSED_SEED) == one_engine_audio[REFUSED_SEED]
        if metric(two_ranks, "vllm:voxserve_rank_retries_total") > before:
            break
    assert metric(two_ranks, "vllm:voxserve_rank_retries_total") > before
    assert metric(two_ranks, "vllm:voxserve_requests_refused_total") == 0  # no 503


def test_clients_leaving_free_their_ranks_codec_slots(two_ranks, one_engine_audio):
    with ThreadPoolExecutor(4) as pool:
        left = list(pool.map(lambda i: leave_after_first_audio(two_ranks, 100 + i), range(12)))
    assert all(left)
    deadline = time.monotonic() + 60
    while metric(two_ranks, "vllm:num_requests_running") + metric(two_ranks, "vllm:num_requests_waiting") > 0:
        assert time.monotonic() < deadline, "requests left running on a rank after their clients left"
        time.sleep(0.5)
    # all 2 x SLOTS codec slots are free: as many streams at once get all of their audio, as one engine made it
    started = time.monotonic()
    heard = concurrently(two_ranks, SEEDS)
    assert all(heard[seed] == one_engine_audio[seed] for seed in SEEDS)
    assert time.monotonic() - started < 120


def test_a_mode_switch_reaches_both_ranks(two_ranks):
    modes = requests.get(f"{two_ranks}/voxserve/modes", timeout=60).json()
    assert modes["ranks"] == 2
    original = modes["current"]
    other = f"{original}+prefill_first"  # the admission mode: each rank's scheduler switches
    assert other in modes["modes"]
    for mode in (other, original):
        switched = requests.post(f"{two_ranks}/voxserve/mode", json={"mode": mode}, timeout=60)
        assert switched.status_code == 200, switched.text  # every rank agrees on the new mode
        assert switched.json() == {**modes, "current": mode}
