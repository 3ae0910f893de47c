"""Each open stream's frames that are not yet cut into a chunk, in one device tensor.

A step completes one frame per decode row: the rows arrive as one tensor [n, Q], and one `write` scatters them into
their streams' places (`slot * width + frames pending`), instead of one tensor view per row kept in Python lists
(the per-row host work of every step). A chunk is cut by copying its frames out (`take`), so the slot's rows can be
written again at once while the chunk waits for the codec."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_voxserve.codec_lanes.lane_manager import SlotAllocator


class FrameStore:
    def __init__(self, num_slots: int, width: int, codes_per_frame: int, device: torch.device) -> None:
        """`width`: the most frames a stream holds before a cut (the largest chunk)."""
        self.width, self.device = width, device
        self.codes = torch.zeros(num_slots * width, codes_per_frame, dtype=torch.long, device=device)
        self._slots = SlotAllocator(num_slots, "frame store slot")

    def open(self) -> int:
        """A free slot for a new stream; RuntimeError when none is left."""
        return self._slots.allocate()

    def close(self, slot: int) -> None:
        self._slots.free(slot)

    def write(self, frames: torch.Tensor, places: Sequence[int]) -> None:
        """frames [n, Q] (any device) to the flat places `slot * width + index`, in one copy."""
        index = torch.as_tensor(places, dtype=torch.long).to(self.device, non_blocking=True)
        self.codes.index_copy_(0, index, frames.to(self.device, dtype=torch.long))

    def take(self, slot: int, count: int) -> torch.Tensor:
        """A copy of the slot's first `count` frames [count, Q]."""
        start = slot * self.width
        return self.codes[start : start + count].clone()

    def take_many(self, spans: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Copies of several slots' first frames, (slot, count) each, in one gather: (the gathered frames
        [sum of counts, Q], one view of them per span). A step cuts a chunk for about one stream in ten: one copy
        each was two device ops per chunk on the engine's thread."""
        index = [slot * self.width + i for slot, count in spans for i in range(count)]
        gathered = self.codes.index_select(0, torch.as_tensor(index, dtype=torch.long).to(self.device,
                                                                                         non_blocking=True))
        return gathered, list(gathered.split([count for _, count in spans]))
