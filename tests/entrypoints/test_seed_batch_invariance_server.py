"""A seeded, sampled request gives the same audio alone and among other requests (CPU server, tiny checkpoint, fp32).

Codebook 0 is drawn in the model with the request's counter noise, as the code predictor's codebooks are, so the
codes cannot depend on the batch; one chunk per codec call makes equal codes give byte-identical audio.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

SAMPLED = {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.05,
           "subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0}
PROBE = {"input": "The same words, whatever runs beside them.", "voice": "ryan", "seed": 4242,
         "max_new_tokens": 30, **SAMPLED}
OTHERS = [{"input": f"Another sentence number {i}, spoken at once.", "voice": "vivian" if i % 2 else "ryan",
           "seed": 17 + i, "max_new_tokens": 20 + 3 * i, **SAMPLED} for i in range(7)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-seeds.log"
    voxserve = {"voxserve": {"scheduler": {"overload_mode": "off"}}, "voxserve_internal": {"max_codec_batch": 1}}
    with speech_server(checkpoint, log_path=log, extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def speak(url: str, fields: dict) -> bytes:
    body = {"model": SERVED_NAME, "response_format": "pcm", "ignore_eos": True, **fields}
    response = requests.post(f"{url}/v1/audio/speech", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.content


def test_a_seeded_sampled_request_sounds_the_same_alone_and_among_eight(server):
    alone = speak(server, PROBE)
    assert len(alone) == 29 * 1920 * 2
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda fields: speak(server, fields), [*OTHERS[:3], PROBE, *OTHERS[3:]]))
    assert results[3] == alone
    # the seed matters: another seed is other audio, so equality above is not a constant
    assert speak(server, {**PROBE, "seed": 4243}) != alone
