"""Counter-based uniform noise: the same (seed, step, draw, index) always gives the same number, on any device and
in any batch. Sampling with it makes a request's output independent of which other requests share its batch, and
it needs no RNG state, so it runs inside CUDA graphs. Integer hashing (a murmur3-style finaliser) on int64 tensors.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK  # products stay below 2**64; int64 wraparound keeps the low 32 bits right
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK
    return x ^ (x >> 16)


def _base(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return _mix(_mix(seed.long() * 0x9E3779B1 + 0x632BE5AB) ^ (step.long() * 0x85EBCA77))


def _to_unit(base: torch.Tensor, draw, index: torch.Tensor) -> torch.Tensor:
    x = _mix(base ^ _mix(draw * 0xC2B2AE3D + index * 0x27D4EB2F + 0x165667B1))
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)  # 24 bits: exact in float32, never 0 or 1


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, draws: int, size: int) -> torch.Tensor:
    """seed [B], step [B] (int64) -> uniform float32 in (0, 1) of shape [B, draws, size]."""
    draw = torch.arange(draws, device=seed.device, dtype=torch.long)[None, :, None]
    index = torch.arange(size, device=seed.device, dtype=torch.long)[None, None, :]
    return _to_unit(_base(seed, step)[:, None, None], draw, index)


def uniform_noise_at(seed: torch.Tensor, step: torch.Tensor, draw: int, index: torch.Tensor) -> torch.Tensor:
    """The entries [b, draw, index[b, j]] of `uniform_noise`, for index [B, K]: only the numbers a sampler reads."""
    return _to_unit(_base(seed, step)[:, None], draw, index.long())
