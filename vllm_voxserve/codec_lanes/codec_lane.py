"""A codec lane: an in-order queue of codec batches on one stream, at most one batch in flight.

The scheduler gives a lane its next batch as soon as the previous one is harvested
(paper §3.1), so a lane never queues more than one batch; its static buffers and pinned
staging are therefore free whenever the lane is idle. Completion is read with a CUDA
event (`query()`, never a blocking sync), so polling does not stall the LM lane.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_voxserve.codec_lanes.executables import CodecExecutables, smallest_at_least


class LaneKind(enum.Enum):
    URGENT = "urgent"  # first chunks and chunks near their deadline; whole GPU, greatest priority
    BACKGROUND = "background"  # chunks with slack, batched; codec partition


@dataclass(frozen=True, slots=True)
class CodecChunk:
    """One chunk of one request: codes int64 [F, Q] (CPU or the lanes' device)."""

    request_id: str
    chunk_index: int
    codes: torch.Tensor
    is_last: bool = False


@dataclass(frozen=True, slots=True)
class FinishedChunk:
    """Decoded audio of one chunk: float32 [F * samples_per_frame] on CPU."""

    request_id: str
    chunk_index: int
    audio: torch.Tensor
    is_last: bool
    lane: LaneKind


class CodecLane:
    """Runs batches of chunks through one lane's executables on one stream."""

    def __init__(self, kind: LaneKind, executables: CodecExecutables) -> None:
        self.kind = kind
        self.executables = executables
        self.stream = executables.stream  # None on CPU
        self._in_flight: tuple[CodecChunk, ...] = ()
        self._frames = 0
        self._start: Any = None
        self._done: Any = None
        self._cpu_seconds = 0.0
        self.last_batch_seconds = 0.0  # device time of the last harvested batch (staging included)

    @property
    def max_batch(self) -> int:
        return self.executables.buckets[-1]

    def is_idle(self) -> bool:
        """True when no batch is in flight (finished batches count until harvested)."""
        return not self._in_flight

    def frames_for(self, chunks: Sequence[CodecChunk]) -> int:
        """The prepared frame count a batch runs at. Only a request's last chunk may be
        shorter than it: padding frames would otherwise advance that request's state."""
        longest = max(c.codes.shape[0] for c in chunks)
        frames = smallest_at_least(self.executables.frame_counts, longest)
        for c in chunks:
            if c.codes.shape[0] != frames and not c.is_last:
                raise ValueError(f"chunk {c.chunk_index} of {c.request_id} has {c.codes.shape[0]} frames; "
                                 f"only a last chunk may be padded up to {frames}")
        return frames

    def launch(self, chunks: Sequence[CodecChunk], slots: Sequence[int], fresh_slots: Sequence[int]) -> None:
        """Queue one batch (asynchronous on CUDA). `fresh_slots` are reset before decoding."""
        if not self.is_idle():
            raise RuntimeError(f"{self.kind.value} lane already has a batch in flight")
        if not chunks or len(chunks) > self.max_batch:
            raise ValueError(f"batch of {len(chunks)} does not fit the {self.kind.value} lane (max {self.max_batch})")
        frames = self.frames_for(chunks)
        exe = self.executables
        if self.stream is None:
            t = time.perf_counter()
            bucket = exe.plan([c.codes for c in chunks], slots, fresh_slots, frames)
            exe.run(bucket, frames)
            self._cpu_seconds = time.perf_counter() - t
        else:
            producer = torch.cuda.current_stream(exe.device)
            if any(c.codes.is_cuda for c in chunks):
                self.stream.wait_stream(producer)  # codes were written on the producer's stream
                for c in chunks:
                    if c.codes.is_cuda:
                        c.codes.record_stream(self.stream)
            with torch.cuda.stream(self.stream):
                self._start = torch.cuda.Event(enable_timing=True)
                self._start.record(self.stream)
                bucket = exe.plan([c.codes for c in chunks], slots, fresh_slots, frames)
                exe.run(bucket, frames)
                exe.copy_out(len(chunks))
                self._done = torch.cuda.Event(enable_timing=True)
                self._done.record(self.stream)
        self._in_flight, self._frames = tuple(chunks), frames

    def finished(self) -> bool:
        """Non-blocking: has the batch in flight finished on the device?"""
        return bool(self._in_flight) and (self._done is None or self._done.query())

    def harvest(self, block: bool = False) -> list[FinishedChunk] | None:
        """Return the finished batch's audio and free the lane, or None if it is still running."""
        if not self._in_flight:
            return None
        if not self.finished():
            if not block:
                return None
            self._done.synchronize()
        spf = self.executables.program.samples_per_frame
        wav = self.executables.wav_host[: len(self._in_flight)].clone()  # one copy: the next batch reuses wav_host
        out = [FinishedChunk(c.request_id, c.chunk_index, wav[i, :c.codes.shape[0] * spf], c.is_last, self.kind)
               for i, c in enumerate(self._in_flight)]
        if self._done is None:
            self.last_batch_seconds = self._cpu_seconds
        else:
            self.last_batch_seconds = self._start.elapsed_time(self._done) / 1000.0
        self._in_flight, self._start, self._done = (), None, None
        return out
