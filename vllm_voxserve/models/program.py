"""The codec-facing part of a model program (paper §3.4).

A model program declares its codec once; the codec lanes build executables from it
(one per batch bucket and SM partition) and keep each request's codec state in a
device-side slot of the program's state pool. CosyVoice, Higgs and Qwen3-TTS each
implement `CodecProgram`; the lanes know nothing else about the model.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class CodecStatePool(Protocol):
    """Per-request codec state (conv histories, attention caches, overlap tails) in slots.

    Every state tensor has the slot as its first dimension, so a batch gathers its rows
    with `index_select(0, slots)` and scatters them back with `index_copy_(0, slots, ...)`.
    """

    num_slots: int

    def reset(self, slots: torch.Tensor) -> None:
        """Zero the state of `slots` (int64 [K], on the pool's device); no host sync."""
        ...


@runtime_checkable
class CodecProgram(Protocol):
    """A stateful, causal codec that turns frames of codes into audio samples."""

    frame_rate_hz: float
    samples_per_frame: int
    codes_per_frame: int

    def make_state_pool(self, num_slots: int, device: torch.device) -> CodecStatePool:
        """Allocate state for `num_slots` requests, all zeroed."""
        ...

    def decode(self, codes: torch.Tensor, slots: torch.Tensor, pool: CodecStatePool) -> torch.Tensor:
        """Decode one chunk per row and advance each row's state.

        codes: int64 [B, F, Q] (Q = codes_per_frame); slots: int64 [B], distinct except for
        padding rows; returns float32 [B, F * samples_per_frame]. Row b must depend only on
        codes[b] and the state in slots[b] (batching never changes a row's audio), and the
        call must be capturable in a CUDA graph: no host sync, no data-dependent shapes.
        """
        ...


def sample_rate(program: CodecProgram) -> int:
    """Output samples per second of a codec program."""
    return round(program.frame_rate_hz * program.samples_per_frame)
