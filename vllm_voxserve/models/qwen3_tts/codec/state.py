"""Exact incremental codec decode with per-request state in fixed device slots.

`CodecStatePool` holds every request's streaming state (transformer K/V of the last W-1 frames per layer, the frame
position, every causal conv's left input history) as one `[num_slots, ...]` tensor per entry. `decode_chunk` gathers
a batch's slots, decodes F new frames per row, and scatters the new state back. Shapes depend only on (B, F); slots,
positions and masks stay on the device, so one call can be captured in a CUDA graph per (B, F) and replayed with
different slots. Any chunk schedule gives the same samples as one full decode (up to float rounding)."""
from __future__ import annotations

import torch

from .configuration import CodecDecoderConfig
from .decoder import POSITION, CodecDecoder


def codec_state_shapes(config: CodecDecoderConfig) -> dict[str, tuple[int, ...]]:
    """Per-request state entries of a decoder with this config (built on the meta device, no memory)."""
    with torch.device("meta"):
        return CodecDecoder(config).state_shapes()


class CodecStatePool:
    def __init__(self, decoder_config: CodecDecoderConfig, num_slots: int, dtype: torch.dtype, device):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.config = decoder_config
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device(device)
        self.tensors: dict[str, torch.Tensor] = {}
        for name, shape in codec_state_shapes(decoder_config).items():
            entry_dtype = torch.long if name == POSITION else dtype
            self.tensors[name] = torch.zeros((num_slots, *shape), dtype=entry_dtype, device=self.device)

    @property
    def bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())

    def reset(self, slots: torch.Tensor) -> None:
        """Start new requests in these slots (a zero state is the start of a sequence)."""
        slots = slots.to(self.device)
        for t in self.tensors.values():
            t.index_fill_(0, slots, 0)

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """Frames decoded so far in each slot (a device tensor; reading it on the host syncs)."""
        return self.tensors[POSITION].index_select(0, slots.to(self.device))

    def gather(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t.index_select(0, slots) for name, t in self.tensors.items()}

    def scatter(self, slots: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        for name, t in self.tensors.items():
            t.index_copy_(0, slots, state[name].to(t.dtype))


def decode_chunk(
    decoder: CodecDecoder, codes: torch.Tensor, slots: torch.Tensor, pool: CodecStatePool, stream=None
) -> torch.Tensor:
    """Decode the next F frames of B requests: codes `[B, F, num_quantizers]` long, slots `[B]` long (distinct,
    on the pool's device) -> wav `[B, F * samples_per_frame]`. Rows may be at different positions.
    `stream`: a stand-in for `decoder.stream` with its signature (e.g. a compiled one)."""
    if codes.dim() != 3 or codes.shape[0] != slots.shape[0] or codes.shape[1] < 1:
        raise ValueError(
            f"codes must be [B, F>=1, Q] with B = len(slots), got {tuple(codes.shape)} and {tuple(slots.shape)}"
        )
    if next(decoder.parameters()).dtype != pool.dtype:
        raise ValueError(f"the pool holds {pool.dtype} state but the decoder runs in {next(decoder.parameters()).dtype}")
    state = pool.gather(slots)
    wav = (stream or decoder.stream)(codes.transpose(1, 2), state)
    pool.scatter(slots, state)
    return wav[:, 0]
