"""The player model behind the lateness and stall metrics, on a simulated clock; the metered chunk stream."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.entrypoints.prometheus_text import sample_value
from vllm_voxserve.entrypoints.edge_admission import EdgeGuard
from vllm_voxserve.entrypoints.speech_metrics import PlaybackClock, SpeechMetrics, metered
from vllm_voxserve.scheduler.concurrency_limit import LimitSettings

RATE = 24000
CHUNK = 19200  # 0.8 s


def test_chunks_that_come_before_the_audio_before_them_has_played_are_on_time():
    player = PlaybackClock(RATE)
    assert player.arrive(10.0, CHUNK) == 0.0  # playback starts with the first audio
    assert player.arrive(10.5, CHUNK) == 0.0  # due at 10.8
    assert player.arrive(11.6, CHUNK) == 0.0  # due at 11.6 exactly
    assert player.stalled_s == 0.0


def test_a_late_chunk_stalls_the_player_and_pushes_later_deadlines_back():
    player = PlaybackClock(RATE)
    player.arrive(0.0, CHUNK)
    assert player.arrive(1.0, CHUNK) == pytest.approx(0.2)  # due at 0.8: the player waited 0.2 s
    # playback resumed at 1.0 with 0.8 s of audio: the next chunk is due at 1.8, not 1.6
    assert player.arrive(1.7, CHUNK) == 0.0
    assert player.arrive(2.9, CHUNK) == pytest.approx(0.3)  # due at 2.6
    assert player.stalled_s == pytest.approx(0.5)
    assert player.plays_until() == pytest.approx(3.7)


class Recorder:
    def __init__(self):
        self.ttfa, self.lateness, self.audio_s, self.running = [], [], 0.0, 0

    def first_audio(self, waited):
        self.ttfa.append(waited)

    def audio(self, seconds):
        self.audio_s += seconds

    def streamed_chunk(self, lateness):
        self.lateness.append(lateness)

    def stream_started(self):
        self.running += 1

    def stream_ended(self):
        self.running -= 1


def edge() -> EdgeGuard:
    return EdgeGuard(LimitSettings(0.2, 16), retry_after_s=1.0)


@pytest.mark.parametrize("streamed", [True, False])
def test_metered_measures_ttfa_lateness_and_running_streams(streamed):
    times = iter([5.0, 6.0, 6.5, 7.0])  # arrivals of three 0.8 s chunks, then the end; the request arrived at 4.75
    recorder, guard = Recorder(), edge()
    ticket = guard.admit(4.75)

    async def chunks():
        for _ in range(3):
            yield np.zeros(CHUNK, np.float32)

    async def run():
        stream = metered(chunks(), recorder, ticket, streamed, RATE, clock=lambda: next(times))
        out = [c async for c in stream]
        return out

    assert len(asyncio.run(run())) == 3
    assert recorder.ttfa == [pytest.approx(0.25)]
    assert recorder.audio_s == pytest.approx(2.4)
    assert recorder.lateness == ([0.0, pytest.approx(0.2), 0.0] if streamed else [])
    assert recorder.running == 0
    # the admission ticket: played out at 5.0 + 0.2 stalled + 2.4; a whole file's first audio is its first chunk's
    # arrival, a stream's its first bytes out (the route's); ended with the stream
    assert ticket.audio_until == pytest.approx(7.6)
    assert ticket.first_audio_time == (None if streamed else 5.0)
    assert guard.in_progress == 0


def test_closing_the_metered_stream_closes_the_request_and_ends_the_running_stream():
    recorder, closed, guard = Recorder(), [], edge()

    async def chunks():
        try:
            while True:
                yield np.zeros(CHUNK, np.float32)
        finally:
            closed.append(True)

    async def run():
        stream = metered(chunks(), recorder, guard.admit(0.0), True, RATE, clock=lambda: 1.0)
        await stream.__anext__()
        assert recorder.running == 1 and guard.in_progress == 1
        await stream.aclose()

    asyncio.run(run())
    assert closed == [True] and recorder.running == 0 and guard.in_progress == 0


def test_the_metrics_are_one_set_per_process_in_vllms_naming():
    from prometheus_client import REGISTRY, generate_latest

    metrics = SpeechMetrics.get("tiny")
    assert SpeechMetrics.get("tiny") is metrics
    metrics.refuse("invalid")
    metrics.streamed_chunk(0.3)
    text = generate_latest(REGISTRY).decode()
    assert 'vllm:voxserve_requests_refused_total{model_name="tiny",reason="invalid"}' in text
    assert 'vllm:voxserve_stalls_total{model_name="tiny"}' in text
    assert "# TYPE vllm:voxserve_ttfa_seconds histogram" in text


def test_the_engine_counters_serve_as_histograms_counters_and_rates():
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_voxserve.entrypoints.engine_metrics import EngineSpeechCollector
    from vllm_voxserve.contract import CostSample
    from vllm_voxserve.speech_stats import EngineSpeechStats

    stats = EngineSpeechStats()
    collector = EngineSpeechCollector("tiny")
    registry = CollectorRegistry()
    registry.register(collector)
    assert "voxserve" not in generate_latest(registry).decode()  # nothing before the first answer
    stats.observe([CostSample("decode", 4, 0.5), CostSample("urgent_codec", 3, 0.25)])
    stats.backbone_frames = 100
    collector.update(stats.snapshot(), now=10.0)
    stats.observe([CostSample("urgent_codec", 1, 0.5), CostSample("background_codec", 8, 1.0),
                   CostSample("prefill", 30, 0.1, decode_rows=2)])
    stats.backbone_frames = 150
    collector.update(stats.snapshot(), now=12.0)
    text = generate_latest(registry).decode()
    urgent, background = {"model_name": "tiny", "lane": "urgent"}, {"model_name": "tiny", "lane": "background"}
    assert sample_value(text, "vllm:voxserve_codec_batch_size_bucket", le="2", **urgent) == 1
    assert sample_value(text, "vllm:voxserve_codec_batch_size_bucket", le="4", **urgent) == 2
    assert sample_value(text, "vllm:voxserve_codec_batch_size_count", **urgent) == 2
    assert sample_value(text, "vllm:voxserve_codec_batch_size_sum", **urgent) == 4
    assert sample_value(text, "vllm:voxserve_codec_batch_size_bucket", le="4", **background) == 0
    assert sample_value(text, "vllm:voxserve_codec_busy_seconds_total", **urgent) == 0.75
    assert sample_value(text, "vllm:voxserve_codec_busy_fraction", **urgent) == 0.25  # 0.5 s of the 2 s between
    assert sample_value(text, "vllm:voxserve_codec_busy_fraction", **background) == 0.5
    assert sample_value(text, "vllm:voxserve_backbone_frames_total", model_name="tiny") == 150
    assert sample_value(text, "vllm:voxserve_backbone_frames_per_second", model_name="tiny") == 25


def test_the_grafana_dashboard_queries_only_series_the_server_serves():
    import json
    import re
    from pathlib import Path

    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    from vllm_voxserve.entrypoints.engine_metrics import EngineSpeechCollector
    from vllm_voxserve.contract import CostSample
    from vllm_voxserve.speech_stats import EngineSpeechStats

    metrics = SpeechMetrics.get("tiny")
    metrics.first_audio(0.1)
    metrics.refuse("overloaded")
    metrics.streamed_chunk(0.0)
    metrics.audio(0.8)
    metrics.stream_started()
    metrics.stream_ended()
    stats = EngineSpeechStats()
    stats.observe([CostSample("urgent_codec", 2, 0.1)])
    engine = EngineSpeechCollector("tiny")
    engine.update(stats.snapshot(), 1.0)
    registry = CollectorRegistry()
    registry.register(engine)
    served = set(re.findall(r"^(vllm:voxserve_\w+?)(?:\{| )",
                            generate_latest(REGISTRY).decode() + generate_latest(registry).decode(), re.M))
    dashboard = Path(__file__).parents[2] / "docs" / "grafana" / "voxserve-speech.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"vllm:voxserve_\w+", expr)}
    assert len(queried) >= 9
    assert queried <= served, queried - served
