"""SpeechRuntime's step report for the scheduler: progress per request, first-audio time, step costs; and that it
survives the pickling between vLLM's worker and engine-core processes."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import torch

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_codec_decoder, make_random_speech_tokenizer
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram
from vllm_voxserve.worker.audio_pipeline import AudioPipeline
from vllm_voxserve.worker.runtime import SpeechRuntime, held_device_bytes
from vllm_voxserve.models.step_layout import StepLayout


class FakeSender:
    def __init__(self):
        self.audio = []

    def send_audio(self, address, stream_key, seq, pcm):
        self.audio.append((stream_key, seq, np.asarray(pcm)))

    def send_end(self, address, stream_key, seq):
        self.audio.append((stream_key, seq, "END"))

    def send_error(self, address, stream_key, seq, message):
        self.audio.append((stream_key, seq, f"ERROR {message}"))


class FakeModel:
    """The talker side: hands the runtime one frame per decode row."""

    def __init__(self):
        self.requests = {}
        self.rows = []

    def prepare_step(self, layout, row_check=None):
        self.rows = [rid for rid, n in zip(layout.req_ids, layout.num_tokens) if n == 1]

    def take_frames(self):
        rows = [type("Row", (), {"req_id": rid})() for rid in self.rows]
        return torch.zeros(len(rows), 16, dtype=torch.long), rows

    def remove_request(self, req_id):
        pass


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speech_tokenizer")
    make_random_speech_tokenizer(folder, "tiny", 0, torch.float32)
    return Qwen3CodecProgram(load_codec_decoder(folder, torch.float32))


def runtime_with(program, codec_mode: str = "auto") -> SpeechRuntime:
    runtime = SpeechRuntime.__new__(SpeechRuntime)  # no checkpoint: a fake talker, the tiny codec
    runtime.config = VoxServeConfig(first_chunk_frames=4, chunk_frames=3, codec_mode=codec_mode)
    runtime.model = FakeModel()
    runtime.pipeline = AudioPipeline(program, runtime.config, FakeSender(), torch.device("cpu"))
    runtime._failed = {}
    runtime.fault = None
    runtime._init_report()
    return runtime


def test_report_tracks_frames_chunks_first_audio_and_step_costs(program):
    runtime = runtime_with(program)
    runtime.pipeline.open("r", "key", "ipc://unused")
    runtime.prepare_step(StepLayout(("r",), (20,), (0,)))  # prefill
    runtime.after_forward()
    report = runtime.step_report()
    assert [(p.request_id, p.frames_generated, p.chunks_delivered, p.first_audio_time) for p in report.progress] \
        == [("r", 0, 0, None)]
    assert [(c.kind, c.size) for c in report.costs] == [("prefill", 20)]
    before = time.monotonic()
    handovers = []
    for position in range(20, 24):  # four decode steps: four frames, the first chunk
        runtime.prepare_step(StepLayout(("r",), (1,), (position,)))
        runtime.after_forward()
        report = runtime.step_report()
        handovers.append(report.first_audio_handovers)
    [progress] = report.progress
    assert (progress.frames_generated, progress.chunks_delivered) == (4, 1)
    assert progress.audio_delivered_s == pytest.approx(4 * 0.08)
    assert before <= progress.first_audio_time <= report.now
    assert [(c.kind, c.size) for c in report.costs] == [("decode", 1), ("urgent_codec", 1)]
    # the step log's first-audio path: one sample each, drained from the pipeline (worker time, ms)
    gauges = runtime.host_times._gauges
    assert len(gauges["first chunk ms after prefill"]) == 1 and len(gauges["first audio ms after cut"]) == 1
    assert gauges["first chunk ms after prefill"][0] >= 0 and not runtime.pipeline.first_audio_paths
    assert gauges["first chunk steps after prefill"] == [4]  # every one of the four steps decoded it
    # and the scheduler's: the first chunk's cut to its audio, in the report of the step that sent it, once
    assert handovers[:3] == [[], [], []] and len(handovers[3]) == 1
    assert handovers[3][0] == pytest.approx(gauges["first audio ms after cut"][0] / 1e3, abs=1e-4)
    assert runtime.step_report().first_audio_handovers == []
    runtime.finish("r")
    assert runtime.step_report().progress == []


def test_step_log_splits_the_lanes_pump_into_its_parts(program):
    """Harvest, deliver, plan, launch and drain host time, one sample a step; the CPU lane decodes inside the launch."""
    runtime = runtime_with(program, codec_mode="lanes")
    runtime.pipeline.open("r", "key", "ipc://unused")
    runtime.prepare_step(StepLayout(("r",), (20,), (0,)))
    runtime.after_forward()
    for position in range(20, 24):  # the fourth frame cuts the first chunk, which is launched at once
        runtime.prepare_step(StepLayout(("r",), (1,), (position,)))
        runtime.after_forward()
    gauges = runtime.host_times._gauges
    parts = [gauges[f"lanes {part} us"] for part in ("harvest", "deliver", "plan", "launch", "drain")]
    assert [len(samples) for samples in parts] == [5] * 5
    # the chunk is launched and (a CPU lane is synchronous) harvested and sent in the fifth step; nothing blocks
    assert parts[3][:4] == [0, 0, 0, 0] and parts[3][4] > 0
    assert parts[1][:4] == [0, 0, 0, 0] and parts[1][4] > 0
    assert parts[4] == [0] * 5
    assert set(runtime.pipeline.lanes.pump_seconds.values()) == {0.0}  # read and reset by the step log
    # its whole host time is also counted over the window (the line's mean rate beside the per-step median)
    assert runtime.host_times._counts["lanes pump host us"] == sum(gauges["lanes pump us"]) > 0
    # the harvested batch reaches the step log's lane line (chunks, device time, rows run at), and only once
    [(size, seconds, rows)] = runtime.host_times._batches["urgent lane"]
    assert size == 1 and seconds > 0 and rows >= size
    assert not runtime.pipeline.lanes.harvested


def test_step_log_shows_the_models_codebook0_draw_once_a_step(program):
    """The model's eager draw runs on the engine's thread beside our parts: a gauge of its host time, one sample for
    each step that drew (Model Runner V2 draws before after_forward)."""
    runtime = runtime_with(program)
    runtime.pipeline.open("r", "key", "ipc://unused")
    for position, drew in ((20, 0.0005), (21, None), (22, 0.0012)):
        runtime.model.last_draw_s = drew
        runtime.prepare_step(StepLayout(("r",), (1,), (position,)))
        runtime.after_forward()
    assert runtime.host_times._gauges["codebook0 draw us"] == [500, 1200]
    assert runtime.model.last_draw_s is None  # read once


def test_report_attached_to_a_model_runner_output_survives_pickling(program):
    from vllm.v1.outputs import ModelRunnerOutput

    from vllm_voxserve.compat import STEP_REPORT_ATTR, attach_step_report, step_report_of

    runtime = runtime_with(program)
    runtime.pipeline.open("r", "key", "ipc://unused")
    runtime.prepare_step(StepLayout(("r",), (1,), (20,)))
    runtime.after_forward()
    output = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0}, sampled_token_ids=[[5]])
    attach_step_report(output, runtime.step_report)
    copy = pickle.loads(pickle.dumps(output))
    assert getattr(copy, STEP_REPORT_ATTR) == step_report_of(output) is not None


def test_a_preempted_request_keeps_its_stream_through_model_runner_v2s_removal_and_comes_back(program):
    """Model Runner V2 removes a preempted request as if it had finished, then re-adds it: no END in between."""
    runtime = runtime_with(program)
    resumed = []
    runtime.model.resume_request = resumed.append
    for req_id in ("r", "s", "t"):
        runtime.pipeline.open(req_id, f"key-{req_id}", "ipc://unused")
    runtime.preempt({"r", "t", "unknown"}, None)
    for req_id in ("r", "s", "t"):
        runtime.finish(req_id)  # MRV2's removals: r and t preempted, s really finished
    runtime.start("r", 20, None)  # r comes back
    assert resumed == ["r"] and "r" in runtime.pipeline.streams
    runtime.preempt(None, {"t"})  # t was aborted while preempted: it never comes back
    ends = {key: msg for key, _, msg in runtime.pipeline.sender.audio if isinstance(msg, str)}
    assert ends == {"key-s": "END", "key-t": "END"}
    runtime.finish("r")
    assert {key for key, _, msg in runtime.pipeline.sender.audio if msg == "END"} == {"key-r", "key-s", "key-t"}


def test_the_codec_lanes_batch_costs_reach_the_schedulers_report(program):
    """The engine's scheduler weighs the codec lane's frame rate: its batches' times travel in the step report."""
    runtime = runtime_with(program, codec_mode="lanes")
    runtime.pipeline.open("r", "key", "ipc://unused")
    runtime.prepare_step(StepLayout(("r",), (20,), (0,)))
    runtime.after_forward()
    reported = []
    for position in range(20, 24):  # the fourth frame cuts the first chunk: one urgent batch
        runtime.prepare_step(StepLayout(("r",), (1,), (position,)))
        runtime.after_forward()
        reported += [c for c in runtime.step_report().costs if c.kind.endswith("_codec")]
    assert len(reported) == 1 and reported[0].kind == "urgent_codec" and reported[0].size == 1
    assert reported[0].seconds > 0
    assert not [c for c in runtime.step_report().costs if c.kind.endswith("_codec")]  # taken once


def test_held_device_bytes_is_nothing_off_cuda():
    assert held_device_bytes(torch.device("cpu")) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_held_device_bytes_counts_live_tensors_and_a_graphs_pool_not_freed_cache():
    """What the worker takes off the KV cache: memory still held, not the allocator's cache of freed blocks."""
    device = torch.device("cuda")
    before = held_device_bytes(device)
    scratch = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    del scratch
    assert held_device_bytes(device) == before
    x = torch.zeros(1 << 20, device=device)  # 4 MiB
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2  # in the graph's private pool, held while the graph lives
    assert held_device_bytes(device) - before >= 8 << 20
    del graph, y
