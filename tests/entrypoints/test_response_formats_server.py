"""The speech API as users call it, against one real CPU server: every response format whole and streamed, read back
by libsndfile (FAAD2 for AAC); the mp3 default; `speed` for whole files; SSE read by the OpenAI SDK; the speech metrics on /metrics."""

from __future__ import annotations

import base64
import json
import shutil
import time

import numpy as np
import pytest
import requests

from tests.entrypoints.audio_decoding import decode
from tests.entrypoints.prometheus_text import sample_value
from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

FRAME = 1920  # samples of one 80 ms frame: N tokens give N-1 frames; lengths are checked within one frame
TOKENS = 13
BODY = {"model": SERVED_NAME, "input": "Formats for every client.", "voice": "ryan", "max_new_tokens": TOKENS,
        "ignore_eos": True, "seed": 3}
SECONDS = (TOKENS - 1) * FRAME / 24000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-formats.log"
    voxserve = {"voxserve": {"scheduler": {"overload_mode": "off"}}}
    with speech_server(checkpoint, spelling="env", log_path=log,
                       extra_args=("--additional-config", json.dumps(voxserve))) as url:
        yield url


def speech(url: str, lazy: bool = False, **fields) -> requests.Response:
    """POST a speech request (`fields` over BODY); `lazy`: the body is read as it arrives."""
    return requests.post(f"{url}/v1/audio/speech", json={**BODY, **fields}, stream=lazy, timeout=300)


def test_every_format_whole_and_streamed_decodes_to_the_requested_length(server):
    media = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav",
             "pcm": "audio/pcm"}
    default = speech(server)  # no response_format: mp3, as OpenAI
    assert default.status_code == 200, default.text
    assert default.headers["content-type"].startswith("audio/mpeg")
    assert decode("mp3", default.content)[1:] == (24000, (TOKENS - 1) * FRAME)
    for fmt, media_type in media.items():
        for stream in (False, True):
            if stream and fmt == "flac":
                continue
            response = speech(server, lazy=stream, response_format=fmt, stream=stream)
            assert response.status_code == 200, (fmt, stream, response.text)
            assert response.headers["content-type"].startswith(media_type)
            chunks = list(response.iter_content(None))
            _, rate, samples = decode(fmt, b"".join(chunks))
            assert rate == 24000, (fmt, stream)
            assert abs(samples - (TOKENS - 1) * FRAME) < FRAME, (fmt, stream, samples)


@pytest.mark.skipif(shutil.which("faad") is None, reason="needs FAAD2 (faad), which scripts/test.sh installs")
def test_aac_whole_and_streamed_decodes_with_faad_to_sound(server):
    for stream in (False, True):
        response = speech(server, lazy=stream, response_format="aac", stream=stream)
        assert response.status_code == 200, response.text
        audio, rate, samples = decode("aac", b"".join(response.iter_content(None)))
        assert audio is not None and np.abs(audio).max() > 0, stream
        assert rate == 24000 and abs(samples - (TOKENS - 1) * FRAME) < FRAME, (stream, samples)


def test_streamed_mp3_and_opus_start_playing_from_the_first_chunk(server):
    for fmt in ("mp3", "opus"):
        response = speech(server, lazy=True, response_format=fmt, stream_format="audio", max_new_tokens=31)
        assert response.status_code == 200, response.text
        first = next(response.iter_content(None))  # what a browser has before the rest arrives
        response.close()
        _, rate, samples = decode(fmt, first)
        assert rate == 24000 and samples > FRAME, (fmt, samples)


def test_speed_stretches_a_whole_file_and_a_stream_with_speed_is_refused(server):
    normal = decode("wav", speech(server, response_format="wav").content)[0]
    for speed in (0.5, 2.0):
        response = speech(server, response_format="wav", speed=speed)
        assert response.status_code == 200, response.text
        audio = decode("wav", response.content)[0]
        assert abs(len(audio) - len(normal) / speed) < FRAME, (speed, len(audio))
    refused = speech(server, response_format="mp3", speed=1.5, stream=True)
    assert refused.status_code == 400 and "speed" in refused.json()["error"]["message"]
    for bad in (0.1, 4.5):
        response = speech(server, speed=bad)
        assert response.status_code == 400 and "speed" in response.json()["error"]["message"]
    flac_stream = speech(server, response_format="flac", stream=True)
    assert flac_stream.status_code == 400 and "response_format" in flac_stream.json()["error"]["message"]
    assert np.abs(normal).max() > 0


def test_the_openai_sdk_reads_sse_deltas_and_the_done_event_with_usage(server):
    import openai

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    deltas, done = [], None
    with client.audio.speech.with_streaming_response.create(
        model=SERVED_NAME, voice="ryan", input=BODY["input"], response_format="opus", stream_format="sse",
        extra_body={"max_new_tokens": TOKENS, "ignore_eos": True, "seed": 3},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "speech.audio.delta":
                deltas.append(base64.b64decode(event["audio"]))
            else:
                assert done is None
                done = event
    assert len(deltas) >= 2 and done is not None and done["type"] == "speech.audio.done", done
    usage = done["usage"]
    assert usage["output_tokens"] == TOKENS and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    _, rate, samples = decode("opus", b"".join(deltas))
    assert rate == 24000 and abs(samples - (TOKENS - 1) * FRAME) < FRAME


def test_speech_metrics_on_vllms_metrics_move_with_requests(server):
    labels = {"model_name": SERVED_NAME}

    def scrape() -> str:
        response = requests.get(f"{server}/metrics", timeout=30)
        assert response.status_code == 200
        return response.text

    def value(text: str, name: str, **more) -> float:
        found = sample_value(text, name, **labels, **more)
        return 0.0 if found is None else found

    before = scrape()
    assert speech(server, response_format="ogg").status_code == 400
    streamed = speech(server, lazy=True, response_format="pcm", stream=True, max_new_tokens=31)
    assert streamed.status_code == 200 and len(streamed.content) == 30 * FRAME * 2
    assert speech(server, response_format="pcm").status_code == 200
    after = scrape()
    assert value(after, "vllm:voxserve_ttfa_seconds_count") == value(before, "vllm:voxserve_ttfa_seconds_count") + 2
    assert value(after, "vllm:voxserve_ttfa_seconds_sum") > value(before, "vllm:voxserve_ttfa_seconds_sum")
    # 31 tokens: 30 frames in chunks of the server's chunk size, each streamed chunk judged against the player
    assert value(after, "vllm:voxserve_chunk_lateness_seconds_count") >= \
        value(before, "vllm:voxserve_chunk_lateness_seconds_count") + 2
    assert sample_value(after, "vllm:voxserve_stalls_total", **labels) is not None
    assert value(after, "vllm:voxserve_requests_refused_total", reason="invalid") == \
        value(before, "vllm:voxserve_requests_refused_total", reason="invalid") + 1
    assert value(after, "vllm:voxserve_audio_seconds_total") == pytest.approx(
        value(before, "vllm:voxserve_audio_seconds_total") + (30 + TOKENS - 1) * FRAME / 24000)
    assert value(after, "vllm:voxserve_running_streams") == 0
    # the engine's counters come every few seconds: wait for the answer that includes these requests
    deadline = time.monotonic() + 60
    while value(after, "vllm:voxserve_backbone_frames_total") < \
            value(before, "vllm:voxserve_backbone_frames_total") + 30 + TOKENS - 1:
        assert time.monotonic() < deadline, after[-3000:]
        time.sleep(1)
        after = scrape()
    assert value(after, "vllm:voxserve_codec_batch_size_count", lane="urgent") > \
        value(before, "vllm:voxserve_codec_batch_size_count", lane="urgent")
    assert value(after, "vllm:voxserve_codec_busy_seconds_total", lane="urgent") > 0
    assert sample_value(after, "vllm:voxserve_backbone_frames_per_second", **labels) is not None
