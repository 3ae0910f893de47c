"""A real server's edge admission: past the limit the API server learned from its own first audio, an arrival is
answered 503 with Retry-After at once, and the engine never hears of it; under the limit a request still streams."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.entrypoints.prometheus_text import sample_value
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

FRAME_BYTES = 1920 * 2
EDGE_MESSAGE = "requests in progress at this API server"


def engine_finished(text: str) -> float:
    """Requests the engine has finished, whatever the reason (a request its scheduler refuses ends as an abort)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "vllm:request_success_total")


def test_an_arrival_past_the_edge_limit_is_refused_without_reaching_the_engine(tmp_path):
    checkpoint = make_tiny_checkpoint(tmp_path / "tiny-custom-voice")
    # T = 1 ms: every first audio on this CPU is late, so the first window with one cuts the limit (limit_min_late 1:
    # one late first audio is enough here); floor 1: to one request in progress (the served floor keeps 16, more than
    # this test runs)
    scheduler = {"limit_floor": 1, "limit_min_late": 1}
    config = {"voxserve": {"ttfa_slo_ms": 1}, "voxserve_internal": {"scheduler": scheduler}}
    body = {"model": SERVED_NAME, "voice": "ryan", "ignore_eos": True, "response_format": "pcm", "stream": True}
    with speech_server(checkpoint, log_path=tmp_path / "serve-edge.log",
                       extra_args=("--additional-config", json.dumps(config))) as url:
        speech = f"{url}/v1/audio/speech"

        def scrape() -> str:
            return requests.get(f"{url}/metrics", timeout=30).text

        def edge_refusals(text: str) -> float:
            return sample_value(text, "vllm:voxserve_requests_refused_total", model_name=SERVED_NAME,
                                reason="api_server_limit") or 0.0

        busy = requests.post(speech, json={**body, "input": "A long one.", "max_new_tokens": 1900}, stream=True,
                             timeout=300)
        try:
            assert busy.status_code == 200  # an idle server admits it
            audio = busy.iter_content(4096)  # kept: dropping the iterator would close the connection (an abort)
            next(audio)  # its first audio came (late): the window that closes at the next arrival is a miss
            time.sleep(0.6)  # past the limit's window
            before = scrape()
            refused = requests.post(speech, json={**body, "input": "Too many.", "max_new_tokens": 8}, timeout=300)
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            error = refused.json()["error"]
            assert error["type"] == "service_unavailable" and EDGE_MESSAGE in error["message"]
            time.sleep(1.0)  # an engine's refusal would be counted by now
            after = scrape()
            assert edge_refusals(after) == edge_refusals(before) + 1
            assert engine_finished(after) == engine_finished(before)  # the engine never saw it
        finally:
            busy.close()
        # the busy request's client left: once the server has ended it, a request is under the limit again
        loose = {"ttfa_slo_ms": 60_000}  # the engine judges it by its own target (it may still be draining)
        for _ in range(120):
            served = requests.post(speech, json={**body, **loose, "input": "In time.", "max_new_tokens": 8},
                                   timeout=300)
            if served.status_code != 503 or EDGE_MESSAGE not in served.json()["error"]["message"]:
                break
            time.sleep(0.5)
        assert served.status_code == 200 and len(served.content) == 7 * FRAME_BYTES
