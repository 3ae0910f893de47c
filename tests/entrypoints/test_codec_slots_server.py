"""A CPU server with one codec slot: requests one after another are all served.

The worker's codec slots are counted from its last step report; a step only reports while something generates. After
a request ends, nothing generates, so the count still holds its slot: the next request must be served regardless (an
H200 server hung for good so, with all 256 slots counted, in run 2026-11-30_cf01941).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

SAMPLES_PER_FRAME = 1920


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-one-slot.log"
    voxserve = {"voxserve": {"max_codec_slots": 1, "admin_routes": True, "scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, spelling="env", log_path=log,
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_requests_one_after_another_each_get_the_one_slot(server, mode):
    response = requests.post(f"{server}/voxserve/mode", json={"mode": mode}, timeout=120)
    assert response.status_code == 200, response.text
    for seed in (1, 2, 3):
        job = dict(model=SERVED_NAME, input="One slot.", voice="ryan", seed=seed, max_new_tokens=9, ignore_eos=True,
                   response_format="pcm")
        response = requests.post(f"{server}/v1/audio/speech", json=job, timeout=60)
        assert response.status_code == 200, response.text
        assert len(np.frombuffer(response.content, dtype="<i2")) == 8 * SAMPLES_PER_FRAME
