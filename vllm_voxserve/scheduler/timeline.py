"""Chunk schedule and playback deadlines of one streaming request.

Playback starts when the first audio arrives. Chunk k must arrive before the audio delivered ahead of it runs out
(the paper's streaming viability, its Equation 2):

    arrival(k) <= first_audio_time + duration(chunks 0 .. k-1)

The first chunk's deadline is the TTFA target: arrival_time + T.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_voxserve.contract import FRAME_DURATION_S


@dataclass(frozen=True, slots=True)
class ChunkSchedule:
    """Frames per codec chunk: a first chunk (possibly shorter) then chunks of `chunk_frames`."""

    first_chunk_frames: int = 10
    chunk_frames: int = 10
    frame_duration_s: float = FRAME_DURATION_S

    def __post_init__(self) -> None:
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise ValueError("chunk sizes must be >= 1 frame")
        if self.frame_duration_s <= 0:
            raise ValueError("frame_duration_s must be > 0")

    def start_frame(self, chunk: int) -> int:
        """Index of the first frame of `chunk`."""
        if chunk <= 0:
            return 0
        return self.first_chunk_frames + (chunk - 1) * self.chunk_frames

    def end_frame(self, chunk: int) -> int:
        """One past the last frame of `chunk` (before clipping to the request's length)."""
        return self.start_frame(chunk + 1)

    def chunk_of_frame(self, frame: int) -> int:
        if frame < self.first_chunk_frames:
            return 0
        return 1 + (frame - self.first_chunk_frames) // self.chunk_frames

    def num_chunks(self, total_frames: int) -> int:
        return 0 if total_frames <= 0 else self.chunk_of_frame(total_frames - 1) + 1

    def audio_before(self, chunk: int) -> float:
        """Seconds of audio in chunks 0 .. chunk-1."""
        return self.start_frame(chunk) * self.frame_duration_s

    def is_ready(self, chunk: int, frames_generated: int, generation_done: bool) -> bool:
        """All of the chunk's frames exist: it is full, or it is the last, partial chunk of a finished request."""
        if frames_generated >= self.end_frame(chunk):
            return True
        return generation_done and frames_generated > self.start_frame(chunk)


@dataclass(frozen=True, slots=True)
class PlaybackTimeline:
    """Deadlines of one request's chunks on the shared monotonic clock."""

    schedule: ChunkSchedule
    arrival_time: float
    ttfa_target_s: float
    first_audio_time: float | None = None

    def deadline(self, chunk: int) -> float:
        """When chunk `chunk` must have been delivered."""
        return chunk_deadline(self.schedule, chunk, self.arrival_time, self.ttfa_target_s, self.first_audio_time)


def chunk_deadline(
    schedule: ChunkSchedule, chunk: int, arrival_time: float, ttfa_target_s: float, first_audio_time: float | None
) -> float:
    """Before the first audio is known, later chunks are dated from the latest playback start that still meets T."""
    if chunk == 0:
        return arrival_time + ttfa_target_s
    start = first_audio_time if first_audio_time is not None else arrival_time + ttfa_target_s
    return start + schedule.audio_before(chunk)
