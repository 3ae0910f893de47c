"""Counter-based uniform noise: the same (seed, step, draw, index) always gives the same number, on any device and
in any batch. Sampling with it makes a request's output independent of which other requests share its batch, and
it needs no RNG state, so it runs inside CUDA graphs. Integer hashing (a murmur3-style finaliser) on int64 tensors.

The number is `unit(base(seed, step), part(draw, index))`. A caller may take `base` from the host
(`noise_base_on_host` after `seed_half_on_host`, the same bits from numpy) and keep `part` for its fixed draw and
indices (`noise_part`): of the ~60 small kernels of `uniform_noise_at`, about 15 remain per step (codebook 0's draw
does so; it also runs eagerly, in steps too large for a CUDA graph).
"""

from __future__ import annotations

import numpy as np
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


def noise_part(draw, index: torch.Tensor) -> torch.Tensor:
    """The (draw, index) half of the hash, the same for every request and step."""
    return _mix(draw * 0xC2B2AE3D + index * 0x27D4EB2F + 0x165667B1)


def unit(base: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """Uniform float32 in (0, 1) from the two halves (broadcast against each other)."""
    x = _mix(base ^ part)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)  # 24 bits: exact in float32, never 0 or 1


def _to_unit(base: torch.Tensor, draw, index: torch.Tensor) -> torch.Tensor:
    return unit(base, noise_part(draw, index))


def _mix_on_host(x: np.ndarray) -> np.ndarray:
    x = x & _MASK
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK  # below 2**64 in uint64: no wraparound at all
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK
    return x ^ (x >> 16)


def seed_half_on_host(seed: int) -> int:
    """The seed's own mix in `_base`, from a signed 64-bit seed: once per request (`noise_base_on_host` takes it)."""
    with np.errstate(over="ignore"):
        seeded = np.asarray([seed], dtype=np.int64).astype(np.uint64) * np.uint64(0x9E3779B1) + np.uint64(0x632BE5AB)
    return int(_mix_on_host(seeded)[0])


def noise_base_on_host(seed_half, step) -> np.ndarray:
    """`_base(seed, step)` (int64 [B]) with numpy, from each row's `seed_half_on_host(seed)` and its int64 step (any
    sign): uint64 arithmetic wraps modulo 2**64 as int64 does in two's complement, so the low 32 bits every `_mix`
    keeps are the same."""
    with np.errstate(over="ignore"):
        step = np.asarray(step, dtype=np.int64).astype(np.uint64)
        mixed = np.asarray(seed_half, dtype=np.uint64) ^ (step * np.uint64(0x85EBCA77))
    return _mix_on_host(mixed).astype(np.int64)


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, draws: int, size: int) -> torch.Tensor:
    """seed [B], step [B] (int64) -> uniform float32 in (0, 1) of shape [B, draws, size]."""
    draw = torch.arange(draws, device=seed.device, dtype=torch.long)[None, :, None]
    index = torch.arange(size, device=seed.device, dtype=torch.long)[None, None, :]
    return _to_unit(_base(seed, step)[:, None, None], draw, index)


def uniform_noise_at(seed: torch.Tensor, step: torch.Tensor, draw: int, index: torch.Tensor) -> torch.Tensor:
    """The entries [b, draw, index[b, j]] of `uniform_noise`, for index [B, K]: only the numbers a sampler reads."""
    return _to_unit(_base(seed, step)[:, None], draw, index.long())
