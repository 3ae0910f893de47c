"""A small stateful causal codec implementing `CodecProgram`, for lane tests.

Per slot it keeps the last K-1 input frames of every causal conv layer and the running
frame position (fed into a sinusoid), so decoding chunk by chunk equals decoding the
whole utterance at once only if slots are gathered and scattered correctly and chunks
arrive in order.
"""

from __future__ import annotations

import torch
from torch import nn


class ToyStatePool:
    def __init__(self, num_slots: int, layers: int, history: int, channels: int, dtype, device) -> None:
        self.num_slots = num_slots
        self.history = torch.zeros(num_slots, layers, history, channels, dtype=dtype, device=device)
        self.position = torch.zeros(num_slots, dtype=torch.int64, device=device)

    def reset(self, slots: torch.Tensor) -> None:
        self.history.index_fill_(0, slots, 0)
        self.position.index_fill_(0, slots, 0)


class ToyCodec(nn.Module):
    frame_rate_hz = 12.5

    def __init__(self, codes_per_frame: int = 4, vocab: int = 64, channels: int = 32, layers: int = 2,
                 kernel: int = 3, samples_per_frame: int = 16, dtype=torch.float32, seed: int = 0,
                 device: str = "cpu") -> None:
        super().__init__()
        self.codes_per_frame = codes_per_frame
        self.samples_per_frame = samples_per_frame
        self.vocab, self.channels, self.layers, self.kernel = vocab, channels, layers, kernel
        gen = torch.Generator(device).manual_seed(seed)

        def randn(*shape, scale=1.0):
            return nn.Parameter((torch.randn(*shape, generator=gen, device=device) * scale).to(dtype),
                                requires_grad=False)

        self.embed = randn(codes_per_frame * vocab, channels)
        self.freq = nn.Parameter(torch.rand(channels, generator=gen, device=device).to(dtype), requires_grad=False)
        self.conv = randn(layers, kernel * channels, channels, scale=(kernel * channels) ** -0.5)
        self.out = randn(channels, samples_per_frame, scale=channels ** -0.5)
        self.register_buffer("offsets", torch.arange(codes_per_frame, device=device) * vocab, persistent=False)

    def make_state_pool(self, num_slots: int, device: torch.device) -> ToyStatePool:
        return ToyStatePool(num_slots, self.layers, self.kernel - 1, self.channels, self.embed.dtype, device)

    def decode(self, codes: torch.Tensor, slots: torch.Tensor, pool: ToyStatePool) -> torch.Tensor:
        b, f, _ = codes.shape
        x = self.embed[codes + self.offsets].sum(2)  # [B, F, C]
        start = pool.position.index_select(0, slots)
        pos = (start[:, None] + torch.arange(f, device=codes.device)).to(x.dtype)
        x = x + torch.sin(pos[..., None] * self.freq)
        history = pool.history.index_select(0, slots)  # [B, L, K-1, C]
        kept = []
        for layer in range(self.layers):
            xs = torch.cat([history[:, layer], x], dim=1)  # [B, K-1+F, C]
            kept.append(xs[:, f:])
            windows = torch.cat([xs[:, k:k + f] for k in range(self.kernel)], dim=-1)  # [B, F, K*C]
            x = x + torch.tanh(windows @ self.conv[layer])
        pool.history.index_copy_(0, slots, torch.stack(kept, dim=1))
        pool.position.index_copy_(0, slots, start + f)
        return torch.tanh(x @ self.out).reshape(b, f * self.samples_per_frame).float()


def random_codes(frames: int, codec: ToyCodec, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, codec.vocab, (frames, codec.codes_per_frame), generator=gen)


@torch.no_grad()
def decode_alone(codec: ToyCodec, chunks: list[torch.Tensor], device=None) -> torch.Tensor:
    """Reference: one request decoded chunk by chunk in its own fresh pool."""
    device = device or codec.embed.device
    pool = codec.make_state_pool(1, device)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    return torch.cat([codec.decode(c[None].to(device), slots, pool)[0].cpu() for c in chunks])
