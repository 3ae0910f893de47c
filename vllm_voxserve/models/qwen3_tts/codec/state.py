"""Exact incremental codec decode with per-request state in fixed device slots.

`CodecStatePool` holds every request's streaming state (transformer K/V of the last W-1 frames per layer, the frame
position, every causal conv's left input history): the frame positions in one `[num_slots]` tensor, everything else
packed side by side in one `[num_slots, total]` block, with a `[num_slots, ...]` view per entry. `decode_chunk`
gathers a batch's slots (two copies, not one per entry: the codec has dozens of entries, and each copy is a kernel of
every codec batch), decodes F new frames per row, packs the new state (`pack`, which a compiled decode fuses) and
scatters it back (two copies). Shapes depend only on (B, F); slots, positions and masks stay on the device, so one call
can be captured in a CUDA graph per (B, F) and replayed with different slots. Any chunk schedule gives the same samples
as one full decode (up to float rounding)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .configuration import CodecDecoderConfig
from .decoder import POSITION, CodecDecoder


def codec_state_shapes(config: CodecDecoderConfig) -> dict[str, tuple[int, ...]]:
    """Per-request state entries of a decoder with this config (built on the meta device, no memory)."""
    with torch.device("meta"):
        return CodecDecoder(config).state_shapes()


@dataclass(frozen=True)
class StateLayout:
    """Where each state entry but the position lives in a packed row: (name, shape, first column, columns)."""

    entries: tuple[tuple[str, tuple[int, ...], int, int], ...]
    dtype: torch.dtype
    columns: int

    @classmethod
    def of(cls, config: CodecDecoderConfig, dtype: torch.dtype) -> StateLayout:
        entries, first = [], 0
        for name, shape in codec_state_shapes(config).items():
            if name != POSITION:
                entries.append((name, shape, first, math.prod(shape)))
                first += math.prod(shape)
        return cls(tuple(entries), dtype, first)

    def unpack(self, block: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views [B, ...] of each entry in the rows of a packed block [B, columns]."""
        return {name: block[:, first:first + n].view(block.shape[0], *shape) for name, shape, first, n in self.entries}

    def pack(self, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A state dict as (positions [B], packed block [B, columns])."""
        rows = state[POSITION].shape[0]
        block = torch.cat([state[name].reshape(rows, n).to(self.dtype) for name, _, _, n in self.entries], dim=1)
        return state[POSITION], block


class CodecStatePool:
    def __init__(self, decoder_config: CodecDecoderConfig, num_slots: int, dtype: torch.dtype, device,
                 layout: StateLayout | None = None):
        """`layout`: a program's own (built from the same config and dtype), so that its compiled decode and the pool
        share one."""
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.config = decoder_config
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device(device)
        self.layout = layout or StateLayout.of(decoder_config, dtype)
        self.position = torch.zeros((num_slots,), dtype=torch.long, device=self.device)
        self.packed = torch.zeros((num_slots, self.layout.columns), dtype=dtype, device=self.device)
        self.tensors: dict[str, torch.Tensor] = {POSITION: self.position, **self.layout.unpack(self.packed)}

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())

    def reset(self, slots: torch.Tensor) -> None:
        """Start new requests in these slots (a zero state is the start of a sequence)."""
        slots = slots.to(self.device)
        self.position.index_fill_(0, slots, 0)
        self.packed.index_fill_(0, slots, 0)

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """Frames decoded so far in each slot (a device tensor; reading it on the host syncs)."""
        return self.position.index_select(0, slots.to(self.device))

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """These slots' state as (positions [B], packed block [B, columns])."""
        return self.position.index_select(0, slots), self.packed.index_select(0, slots)

    def scatter(self, slots: torch.Tensor, position: torch.Tensor, block: torch.Tensor) -> None:
        self.position.index_copy_(0, slots, position.to(torch.long))
        self.packed.index_copy_(0, slots, block)


def decode_and_pack(decoder: CodecDecoder, layout: StateLayout, codes: torch.Tensor, position: torch.Tensor,
                    block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`decoder.stream` on codes [B, Q, F] from a packed state, then the new state packed: (wav, positions, block).
    Compiled whole, the unpacking is free (views) and the packing fuses into the kernels that make the new state."""
    state = {POSITION: position, **layout.unpack(block)}
    wav = decoder.stream(codes, state)
    return (wav, *layout.pack(state))


def decode_chunk(
    decoder: CodecDecoder, codes: torch.Tensor, slots: torch.Tensor, pool: CodecStatePool, step=None
) -> torch.Tensor:
    """Decode the next F frames of B requests: codes `[B, F, num_quantizers]` long, slots `[B]` long (distinct,
    on the pool's device) -> wav `[B, F * samples_per_frame]`. Rows may be at different positions.
    `step`: a stand-in for `decode_and_pack(decoder, pool.layout, ...)` taking (codes [B, Q, F], positions, block),
    e.g. a compiled one."""
    if codes.dim() != 3 or codes.shape[0] != slots.shape[0] or codes.shape[1] < 1:
        raise ValueError(
            f"codes must be [B, F>=1, Q] with B = len(slots), got {tuple(codes.shape)} and {tuple(slots.shape)}"
        )
    if next(decoder.parameters()).dtype != pool.dtype:
        raise ValueError(f"the pool holds {pool.dtype} state but the decoder runs in "
                         f"{next(decoder.parameters()).dtype}")
    position, block = pool.gather(slots)
    if step is None:
        wav, position, block = decode_and_pack(decoder, pool.layout, codes.transpose(1, 2), position, block)
    else:
        wav, position, block = step(codes.transpose(1, 2), position, block)
    pool.scatter(slots, position, block)
    return wav[:, 0]
