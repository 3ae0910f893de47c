"""The policy's view of requests: waiting ones (not yet prefilled) and running streams."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.contract import RequestProgress
from vllm_voxserve.scheduler.timeline import ChunkSchedule, chunk_deadline


@dataclass(slots=True)
class WaitingRequest:
    request_id: str
    arrival_time: float
    prompt_tokens: int
    expected_frames: int | None = None  # the endpoint's estimate from the text (≈ 5.2 frames per word)


@dataclass(slots=True)
class StreamState:
    """One admitted request. The scheduler adapter updates it from `RequestProgress` each step."""

    request_id: str
    arrival_time: float
    prompt_tokens: int = 0
    expected_frames: int | None = None
    frames_generated: int = 0
    generation_done: bool = False
    chunks_delivered: int = 0
    chunk_in_flight: bool = False
    first_audio_time: float | None = None
    # A text stream waiting for text (streaming text in) since then: it has no deadline until it can run again.
    paused_at: float | None = None

    @classmethod
    def admitted(cls, request: WaitingRequest) -> "StreamState":
        return cls(request.request_id, request.arrival_time, request.prompt_tokens, request.expected_frames)

    def apply(self, progress: RequestProgress) -> None:
        if progress.request_id != self.request_id:
            raise ValueError(f"progress for {progress.request_id} applied to {self.request_id}")
        self.frames_generated = progress.frames_generated
        self.generation_done = progress.generation_done
        self.chunks_delivered = progress.chunks_delivered
        self.chunk_in_flight = progress.chunk_in_flight
        if self.first_audio_time is None:
            self.first_audio_time = progress.first_audio_time

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def pause(self, now: float) -> None:
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: float, schedule: ChunkSchedule) -> None:
        """Runnable again: its playback deadlines move by the part of the pause its listener spent without audio
        (from when the audio delivered before ran out, or the pause began if later), as its audio could not go on."""
        if self.paused_at is None:
            return
        if self.first_audio_time is None:
            self.arrival_time += now - self.paused_at
        else:
            ran_out = self.first_audio_time + schedule.audio_before(self.chunks_delivered)
            self.first_audio_time += max(now - max(self.paused_at, ran_out), 0.0)
        self.paused_at = None

    @property
    def next_chunk(self) -> int:
        """The lowest chunk not yet handed to a codec lane."""
        return self.chunks_delivered + int(self.chunk_in_flight)

    def deadline(self, chunk: int, cfg: SchedulerPolicyConfig) -> float:
        return chunk_deadline(schedule_of(cfg), chunk, self.arrival_time, cfg.ttfa_target_s, self.first_audio_time)


@functools.lru_cache(maxsize=64)
def schedule_of(cfg: SchedulerPolicyConfig) -> ChunkSchedule:
    return ChunkSchedule(cfg.first_chunk_frames, cfg.chunk_frames, cfg.frame_duration_s)


def lm_chunk(stream: StreamState, schedule: ChunkSchedule) -> int:
    """The chunk the LM is generating frames for now."""
    return schedule.chunk_of_frame(stream.frames_generated)


INFINITE_SLACK = math.inf
