"""A codec lane: an in-order queue of codec batches on one stream.

A lane holds at most `depth` batches in flight, each in its own set of executables (static buffers, pinned
staging, graphs): the urgent lane one, so a first chunk never queues behind another batch; the background lane two,
so that while one batch runs the next is already queued on the stream and the codec partition does not idle until
the next engine step's pump feeds it (run 2026-12-01_21d5739 on the H200: 80 % busy with hundreds of chunks waiting).
The scheduler still sends a request's next chunk only after its previous one finished. Completion is read with a CUDA
event (`query()`, never a blocking sync), so polling does not stall the LM lane; batches are harvested in launch order.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_voxserve.codec_lanes.executables import CodecExecutables
from vllm_voxserve.models.batch_sizes import smallest_at_least


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


@dataclass(slots=True)
class _Batch:
    chunks: tuple[CodecChunk, ...]
    start: Any = None  # CUDA events around its work on the stream (None on CPU)
    done: Any = None
    cpu_seconds: float = 0.0
    audio: torch.Tensor | None = None  # its output rows on the host (filled once `done`)
    rows: int = 0  # the executable's batch size it ran at: its chunks plus padding rows


class CodecLane:
    """Runs batches of chunks through one lane's executables on one stream. `executables`: one set per batch that
    may be in flight (the lane's depth), all with the same buckets and frame counts, on the same stream."""

    def __init__(self, kind: LaneKind, executables: CodecExecutables | Sequence[CodecExecutables]) -> None:
        sets = [executables] if isinstance(executables, CodecExecutables) else list(executables)
        if not sets or any((e.buckets, e.frame_counts, e.stream) != (sets[0].buckets, sets[0].frame_counts,
                                                                     sets[0].stream) for e in sets):
            raise ValueError("a lane's executable sets must share buckets, frame counts and stream")
        self.kind = kind
        self.executables = sets[0]  # the shape every set shares
        self._sets = sets
        self.stream = self.executables.stream  # None on CPU
        self._in_flight: deque[_Batch] = deque()
        self._next_set = 0  # sets are used in turn and harvested in order: this one is free whenever one is
        self.last_batch_seconds = 0.0  # device time of the last harvested batch (staging included)
        self.last_batch_rows = 0  # and the rows it ran at (its chunks padded up to an executable's batch size)

    @property
    def depth(self) -> int:
        return len(self._sets)

    @property
    def max_batch(self) -> int:
        return self.executables.buckets[-1]

    def is_idle(self) -> bool:
        """True when no batch is in flight (finished batches count until harvested)."""
        return not self._in_flight

    def can_launch(self) -> bool:
        """True when fewer than `depth` batches are in flight."""
        return len(self._in_flight) < self.depth

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
        if not self.can_launch():
            raise RuntimeError(f"{self.kind.value} lane already has {self.depth} batch(es) in flight")
        if not chunks or len(chunks) > self.max_batch:
            raise ValueError(f"batch of {len(chunks)} does not fit the {self.kind.value} lane (max {self.max_batch})")
        frames = self.frames_for(chunks)
        exe = self._sets[self._next_set]
        batch = _Batch(tuple(chunks))
        if self.stream is None:
            t = time.perf_counter()
            batch.rows = exe.plan([c.codes for c in chunks], slots, fresh_slots, frames)
            exe.run(batch.rows, frames)
            batch.audio = exe.copy_out(len(chunks))
            batch.cpu_seconds = time.perf_counter() - t
        else:
            producer = torch.cuda.current_stream(exe.device)
            if any(c.codes.is_cuda for c in chunks):
                # Codes were written on the producer's stream. The batch holds them until it is harvested (after its
                # done event), so their memory cannot be handed out again while this stream reads it: no
                # record_stream per chunk on the engine's thread.
                self.stream.wait_stream(producer)
            with torch.cuda.stream(self.stream):
                # recorded when the stream gets here, i.e. after the batch before it: its device time alone
                batch.start = torch.cuda.Event(enable_timing=True)
                batch.start.record(self.stream)
                batch.rows = exe.plan([c.codes for c in chunks], slots, fresh_slots, frames)
                exe.run(batch.rows, frames)
                batch.audio = exe.copy_out(len(chunks))
                batch.done = torch.cuda.Event(enable_timing=True)
                batch.done.record(self.stream)
        self._in_flight.append(batch)
        self._next_set = (self._next_set + 1) % self.depth

    def finished(self) -> bool:
        """Non-blocking: has the oldest batch in flight finished on the device?"""
        return bool(self._in_flight) and (self._in_flight[0].done is None or self._in_flight[0].done.query())

    def harvest(self, block: bool = False) -> list[FinishedChunk] | None:
        """Return the oldest batch's audio and free its set, or None if it is still running (or none is in flight)."""
        if not self._in_flight:
            return None
        batch = self._in_flight[0]
        if not self.finished():
            if not block:
                return None
            batch.done.synchronize()
        spf = self.executables.program.samples_per_frame
        wav = batch.audio  # the batch's own rows: each chunk's audio is a view of them
        out = [FinishedChunk(c.request_id, c.chunk_index, wav[i, :c.codes.shape[0] * spf], c.is_last, self.kind)
               for i, c in enumerate(batch.chunks)]
        self.last_batch_seconds = (batch.cpu_seconds if batch.done is None
                                   else batch.start.elapsed_time(batch.done) / 1000.0)
        self.last_batch_rows = batch.rows
        self._in_flight.popleft()
        return out
