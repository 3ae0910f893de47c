"""Qwen3-TTS's 12 Hz codec decoder as a `CodecProgram` for the codec lanes."""

from __future__ import annotations

import torch

from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.layers import serve_conv_forms
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, StateLayout, decode_and_pack, decode_chunk


class Qwen3CodecProgram:
    """Adapts `decode_chunk` (codes [B, F, 16] -> wav [B, F*1920]) to the lanes' protocol, with the decoder's convs in
    their served forms (`layers.serve_conv_forms`; changes `decoder`)."""

    def __init__(self, decoder: CodecDecoder, state_dtype: torch.dtype = torch.float32,
                 output_sample_rate: int = 24000, compile: bool = False) -> None:
        """`compile`: torch.compile the decode and the packing of its new state (the GPU's served form: it fuses the
        decoder's element-wise work; SnakeBeta alone is seven kernels), on first use of each chunk length with the
        batch size dynamic. A graph per chunk length indexes by constant sizes: its element-wise kernels ran
        1.2-1.4x faster on the H200 than one graph with the length dynamic, for a second compile at start-up.
        torch.compile specialises size 1, so a lone row runs beside a copy of itself (`_step`): a second compile of
        the whole codec would cost minutes of a GPU server's start-up."""
        serve_conv_forms(decoder)
        self.decoder = decoder
        self.layout = StateLayout.of(decoder.config, state_dtype)
        self._compiled = torch.compile(self._decode_and_pack, backend=_OwnInductor(None, {}, None)) \
            if compile else None
        self.state_dtype = state_dtype
        self.samples_per_frame = decoder.config.samples_per_frame
        self.codes_per_frame = decoder.config.num_quantizers
        self.frame_rate_hz = output_sample_rate / self.samples_per_frame

    def make_state_pool(self, num_slots: int, device: torch.device) -> CodecStatePool:
        return CodecStatePool(self.decoder.config, num_slots, self.state_dtype, device, self.layout)

    def decode(self, codes: torch.Tensor, slots: torch.Tensor, pool: CodecStatePool) -> torch.Tensor:
        step = self._step if self._compiled else None
        return decode_chunk(self.decoder, codes, slots, pool, step).float()

    def _decode_and_pack(self, codes: torch.Tensor, position: torch.Tensor, block: torch.Tensor):
        return decode_and_pack(self.decoder, self.layout, codes, position, block)

    def _step(self, codes: torch.Tensor, position: torch.Tensor, block: torch.Tensor):
        # Contiguous codes: as a view of an executable's static buffer their strides follow the buffer's longest chunk,
        # which the graph's guards tie to this call's length, so every other length compiled the codec again.
        codes = codes.contiguous()
        lone = codes.shape[0] == 1
        if lone:  # batch 1 as batch 2: the compiled graph never sees size 1 (rows are independent; the copy is dropped)
            codes, position, block = _twice(codes), _twice(position), _twice(block)
        for t in (codes, position, block):  # codes [B, Q, F], position [B], block [B, ...]: the batch dynamic
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.mark_static(codes, 2)  # a graph per chunk length: dynamo would make it dynamic at the second
        wav, position, block = self._compiled(codes, position, block)
        return (wav[:1], position[:1], block[:1]) if lone else (wav, position, block)


class _OwnInductor(torch._TorchCompileInductorWrapper):
    """Inductor as one program's own backend. Dynamo hands a cached graph of this function to any caller whose guards
    pass and whose backend compares equal, and two inductor backends with the same options do: a second program in
    the process (another decoder's) would run the first program's graphs."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _twice(t: torch.Tensor) -> torch.Tensor:
    """A batch-1 tensor as two copies of its row, in its own strides (the compiled graph guards on strides)."""
    out = torch.empty_strided((2, *t.shape[1:]), t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t.expand(2, *t.shape[1:]))
