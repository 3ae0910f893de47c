"""The two codec modes behind one interface: what happens to a stream's chunks once the audio pipeline has cut them.

- `InlineCodec`: decoded right after the backbone step that completed them, batched across requests, in the step's
  stream (time sharing, as a stock vLLM deployment would do it);
- `LaneCodec`: handed to the codec lanes, which the pure policy drives (`chunk_dispatch.LaneDispatch`).

Either hands each chunk's audio to `send(request_id, audio)` in chunk order, and calls `ended(request_id, error)`
once a finished stream's last audio has left. The pipeline builds one of each at most, and calls only `CodecRunner`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from vllm_voxserve.codec_lanes.executables import CodecExecutables
from vllm_voxserve.config import CodecMode, VoxServeConfig
from vllm_voxserve.models.batch_sizes import powers_of_two_up_to, smallest_at_least
from vllm_voxserve.models.program import CodecProgram
from vllm_voxserve.worker.chunk_dispatch import LaneDispatch

Send = Callable[[str, object], None]  # (request id, float32 audio [samples], numpy or a CPU tensor)
Ended = Callable[[str, "str | None"], None]  # (request id, error or None)


class CodecRunner(Protocol):
    mode: CodecMode

    def open(self, request_id: str, warmup_codes: torch.Tensor | None) -> None:
        """Take a codec state slot for the stream (RuntimeError when none is free) and decode `warmup_codes` (clamped
        reference frames, Base voice cloning) into it, unheard."""

    def add_frames(self, request_id: str, count: int) -> None:
        """`count` more frames of the stream exist."""

    def decode(self, ready: list[tuple[str, int, torch.Tensor]]) -> None:
        """The chunks cut this step, as (request id, chunk index, frames [F, 16]); called every step, even with none."""

    def finish(self, request_id: str, last: tuple[int, torch.Tensor] | None) -> None:
        """The stream generates no more frames; `last`: its last chunk (index, frames), shorter than the others, or
        None. `ended` follows its last audio."""

    def release(self, request_id: str, drop: bool) -> None:
        """The stream ended: free its slot; `drop` (an error, or nobody listens): also forget what is left of it."""

    def settle(self) -> None:
        """Streams were dropped: deliver what the others are due now, as no engine step may follow."""

    def quiesce(self) -> None:
        """Before a mode switch (no stream open): wait for work still in flight, e.g. a batch of an aborted stream."""


class InlineCodec:
    mode = CodecMode.INLINE

    def __init__(self, program: CodecProgram, config: VoxServeConfig, device: torch.device, send: Send,
                 ended: Ended):
        self.program, self.device, self.send, self.ended = program, device, send, ended
        self.max_batch, self.max_slots = config.max_codec_batch, config.max_codec_slots
        slots = self.max_slots
        self.pool = program.make_state_pool(slots + 1, device)  # + the graphs' padding slot
        self.graphs: CodecExecutables | None = None  # on GPU: codec graphs per (batch, frames)
        if device.type == "cuda" and config.lanes.use_graphs:
            # the same CUDA-graph executables as the lanes, on the whole GPU, replayed in the step's stream
            self.graphs = CodecExecutables(
                program, self.pool, torch.cuda.Stream(device), torch.cuda.current_stream(device), device,
                powers_of_two_up_to(self.max_batch), config.lanes.frame_counts, padding_slot=slots, use_graphs=True)
            self.graphs.capture()
        self.free_slots = list(range(slots - 1, -1, -1))
        self.slots: dict[str, int] = {}  # open streams' codec state slots

    def open(self, request_id: str, warmup_codes: torch.Tensor | None) -> None:
        if not self.free_slots:
            raise RuntimeError(f"all {self.max_slots} codec slots are in use (raise max_codec_slots)")
        slot = self.free_slots.pop()
        self.pool.reset(torch.tensor([slot], dtype=torch.long, device=self.device))
        self.slots[request_id] = slot
        if warmup_codes is not None and len(warmup_codes):
            try:
                self._decode([(request_id, warmup_codes.to(self.device))], send=False)
            except BaseException:
                self.release(request_id, drop=True)
                raise

    def add_frames(self, request_id: str, count: int) -> None:
        pass  # nothing waits on frames: a chunk is decoded as soon as it is cut

    def decode(self, ready: list[tuple[str, int, torch.Tensor]]) -> None:
        self._decode([(request_id, frames) for request_id, _, frames in ready])

    def finish(self, request_id: str, last: tuple[int, torch.Tensor] | None) -> None:
        if last is not None:
            self._decode([(request_id, last[1])], last=True)
        self.ended(request_id, None)

    def release(self, request_id: str, drop: bool) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def settle(self) -> None:
        pass  # nothing is left in flight: every chunk was decoded in the step that cut it

    def quiesce(self) -> None:
        pass

    @torch.no_grad()
    def _decode(self, chunks: list[tuple[str, torch.Tensor]], send: bool = True, last: bool = False) -> None:
        by_length: dict[int, list[tuple[str, torch.Tensor]]] = {}
        for request_id, frames in chunks:
            by_length.setdefault(frames.shape[0], []).append((request_id, frames))
        for group in by_length.values():
            for start in range(0, len(group), self.max_batch):
                batch = group[start : start + self.max_batch]
                wav = self._decode_batch(batch, last)
                if send:
                    for (request_id, _), audio in zip(batch, wav, strict=True):
                        self.send(request_id, audio)

    def _decode_batch(self, batch: list[tuple[str, torch.Tensor]], last: bool):
        """float32 audio [len(batch), F * samples_per_frame] (numpy) of chunks of equal length F."""
        frames = batch[0][1].shape[0]
        slots = [self.slots[r] for r, _ in batch]
        graphs = self.graphs
        if graphs is not None and (frames in graphs.frame_counts or (last and frames <= graphs.frame_counts[-1])):
            # a shorter last chunk runs in the next graph up: its padding frames come after its audio (causal) and
            # only advance a state nobody reads again
            padded = smallest_at_least(graphs.frame_counts, frames)
            bucket = graphs.plan([f for _, f in batch], slots, (), padded)
            wav = graphs.run(bucket, padded)[: len(batch), : frames * self.program.samples_per_frame]
            return wav.cpu().numpy()
        codes = torch.stack([f for _, f in batch]).to(self.device)  # frames may come from the host
        slot_ids = torch.tensor(slots, dtype=torch.long, device=self.device)
        return self.program.decode(codes, slot_ids, self.pool).float().cpu().numpy()


class LaneCodec:
    mode = CodecMode.LANES

    def __init__(self, program: CodecProgram, config: VoxServeConfig, device: torch.device, send: Send,
                 ended: Ended, clock: Callable[[], float] = time.monotonic):
        self.dispatch = LaneDispatch(program, config, device, lambda r, audio: send(r, audio.numpy()), ended, clock)

    def open(self, request_id: str, warmup_codes: torch.Tensor | None) -> None:
        self.dispatch.open(request_id, warmup_codes)

    def add_frames(self, request_id: str, count: int) -> None:
        self.dispatch.add_frames(request_id, count)

    def decode(self, ready: list[tuple[str, int, torch.Tensor]]) -> None:
        for request_id, index, frames in ready:
            self.dispatch.add_chunk(request_id, index, frames)
        self.dispatch.pump()  # every step, even with no new chunk: harvest and launch what is due

    def finish(self, request_id: str, last: tuple[int, torch.Tensor] | None) -> None:
        if last is not None:
            self.dispatch.add_chunk(request_id, last[0], last[1], is_last=True)
        self.dispatch.finish(request_id)  # `ended` now if nothing is left, else after the last chunk's audio

    def release(self, request_id: str, drop: bool) -> None:
        if drop:  # else the lanes have let it go already: its last audio left
            self.dispatch.abort(request_id)

    def settle(self) -> None:
        self.dispatch.settle()

    def quiesce(self) -> None:
        self.dispatch.manager.drain()
