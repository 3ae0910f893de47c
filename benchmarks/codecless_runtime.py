"""The worker's per-step speech side without a checkpoint or codec work, for host-time benchmarks on CPU.

A `SpeechRuntime` holding only its per-step parts (audio pipeline, lanes, step report) runs against a codec that
decodes zeros and a sender that drops everything; `SteadyStreams` stands in for the served model, keeping a fixed
number of requests open that each complete one frame a step. The benchmarks built on it also run at older commits
(copied there with this module), so the runtime's older fields are filled where they differ.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from vllm_voxserve.models.qwen3_tts.step_buffers import DecodeRow
from vllm_voxserve.worker.audio_pipeline import AudioPipeline
from vllm_voxserve.worker.runtime import SpeechRuntime


class NoCodec:
    """A codec program that decodes nothing (zeros): the lanes' bookkeeping without codec work."""

    frame_rate_hz, samples_per_frame, codes_per_frame = 12.5, 1920, 16

    def make_state_pool(self, num_slots: int, device):
        return types.SimpleNamespace(num_slots=num_slots, reset=lambda slots: None)

    def decode(self, codes, slots, pool):
        return torch.zeros(codes.shape[0], codes.shape[1] * self.samples_per_frame)


class NoSender:
    def send_audio(self, *args) -> None:
        pass

    send_end = send_error = send_audio


def codecless_runtime(config, clock: Callable[[], float] | None = None) -> SpeechRuntime:
    """A runtime with the per-step parts only (its `model` is the caller's to set); `clock`, when given, is the
    audio pipeline's."""
    runtime = SpeechRuntime.__new__(SpeechRuntime)
    runtime.config, runtime.device = config, torch.device("cpu")
    runtime._failed = {} if hasattr(SpeechRuntime, "_fail_start") else set()  # a set before fault isolation
    pipeline_clock = {} if clock is None else {"clock": clock}
    runtime.pipeline = AudioPipeline(NoCodec(), config, NoSender(), torch.device("cpu"), **pipeline_clock)
    runtime._init_report()
    return runtime


class SteadyStreams:
    """The served model's side of `after_forward`: `streams` requests, each completing one frame a step; one that
    reaches its length (`new_length()`, drawn as it opens) is finished and replaced."""

    def __init__(self, runtime, streams: int, new_length: Callable[[], int]) -> None:
        self.runtime, self.streams, self.new_length = runtime, streams, new_length
        self.made: dict[str, int] = {}
        self.length: dict[str, int] = {}
        self.opened = 0
        self.codes = torch.zeros(streams, 16, dtype=torch.int64)
        self.requests: dict[str, types.SimpleNamespace] = {}

    def remove_request(self, req_id: str) -> None:
        pass

    def refill(self) -> None:
        while len(self.made) < self.streams:
            req_id = f"r{self.opened}"
            self.opened += 1
            self.runtime.pipeline.open(req_id, f"key-{req_id}", "addr")
            self.requests[req_id] = types.SimpleNamespace(req_id=req_id, failed=None)
            self.made[req_id] = 0
            self.length[req_id] = self.new_length()

    def take_frames(self):
        ids = list(self.made)
        rows = [DecodeRow(i, r, self.made[r]) for i, r in enumerate(ids)]
        for r in ids:
            self.made[r] += 1
        return self.codes[: len(ids)], rows

    def finish_done(self) -> None:
        for req_id in [r for r, n in self.made.items() if n >= self.length[r]]:
            del self.made[req_id], self.length[req_id], self.requests[req_id]
            self.runtime.finish(req_id)
