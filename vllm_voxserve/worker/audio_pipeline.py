"""From frames to audio on the worker: per-request chunking, the codec, and the audio channel.

In the `inline` codec mode every ready chunk is decoded right after the backbone step that completed it, batched
across requests (time sharing, as a stock vLLM deployment would do it). The `lanes` mode hands ready chunks to the
codec lanes instead (`vllm_voxserve.codec_lanes`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.program import CodecProgram
from vllm_voxserve.transport import AudioSender

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Stream:
    stream_key: str
    address: str
    slot: int
    pending: list[torch.Tensor] = field(default_factory=list)  # frames [16] not yet decoded, in order
    chunks_sent: int = 0  # chunk index of the next chunk (its size comes from the config's schedule)
    seq: int = 0  # next message number on the audio channel
    warmup: torch.Tensor | None = None  # reference frames decoded first and not sent (Base voice cloning)


class AudioPipeline:
    def __init__(self, program: CodecProgram, config: VoxServeConfig, sender: AudioSender, device: torch.device):
        self.program, self.config, self.sender, self.device = program, config, sender, device
        self.pool = program.make_state_pool(config.max_codec_slots, device)
        self._free_slots = list(range(config.max_codec_slots - 1, -1, -1))
        self.streams: dict[str, _Stream] = {}

    def open(self, req_id: str, stream_key: str, address: str, warmup_codes: torch.Tensor | None = None) -> None:
        if not self._free_slots:
            raise RuntimeError(f"all {self.config.max_codec_slots} codec slots are in use (raise max_codec_slots)")
        slot = self._free_slots.pop()
        self.pool.reset(torch.tensor([slot], dtype=torch.long, device=self.device))
        self.streams[req_id] = _Stream(stream_key, address, slot)
        if warmup_codes is not None and len(warmup_codes):
            # Decode the reference frames into the state so the first generated sample continues the reference.
            self._decode([(req_id, warmup_codes.to(self.device))], send=False)

    def push(self, codes: torch.Tensor, req_ids: list[str]) -> None:
        """codes [n,16]: one finished frame per entry of req_ids (in frame order per request)."""
        ready: list[tuple[str, torch.Tensor]] = []
        for frame, req_id in zip(codes, req_ids, strict=True):
            stream = self.streams.get(req_id)
            if stream is None:
                continue
            stream.pending.append(frame)
            if len(stream.pending) >= self.config.chunk_frames_at(stream.chunks_sent):
                ready.append((req_id, torch.stack(stream.pending)))
                stream.pending = []
        self._decode(ready)

    def close(self, req_id: str, error: str | None = None) -> None:
        """The request finished (or failed): decode what is left, then END (or ERROR) and free its slot."""
        stream = self.streams.get(req_id)
        if stream is None:
            return
        if error is None and stream.pending:
            self._decode([(req_id, torch.stack(stream.pending))])
        stream = self.streams.pop(req_id)
        if error is None:
            self.sender.send_end(stream.address, stream.stream_key, stream.seq)
        else:
            self.sender.send_error(stream.address, stream.stream_key, stream.seq, error)
        self._free_slots.append(stream.slot)

    def fail(self, req_id: str, error: str) -> None:
        self.close(req_id, error)

    def _decode(self, chunks: list[tuple[str, torch.Tensor]], send: bool = True) -> None:
        by_length: dict[int, list[tuple[str, torch.Tensor]]] = {}
        for req_id, frames in chunks:
            by_length.setdefault(frames.shape[0], []).append((req_id, frames))
        limit = self.config.max_codec_batch
        for group in by_length.values():
            for start in range(0, len(group), limit):
                batch = group[start : start + limit]
                codes = torch.stack([frames for _, frames in batch]).clamp_(0, 2047)
                slots = torch.tensor([self.streams[r].slot for r, _ in batch], dtype=torch.long, device=self.device)
                wav = self.program.decode(codes, slots, self.pool).float().cpu().numpy()
                if send:
                    for (req_id, _), audio in zip(batch, wav, strict=True):
                        self._send(req_id, audio)

    def _send(self, req_id: str, audio) -> None:
        stream = self.streams[req_id]
        self.sender.send_audio(stream.address, stream.stream_key, stream.seq, audio)
        stream.seq += 1
        stream.chunks_sent += 1
