"""Qwen3-TTS's 12 Hz codec decoder as a `CodecProgram` for the codec lanes."""

from __future__ import annotations

import torch

from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.layers import KERNEL_MODES, use_channels_last, use_conv_kernels, use_gemm
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, StateLayout, decode_and_pack, decode_chunk


CONV_KERNELS = ("off", *KERNEL_MODES)
# the config's codec form settings (`voxserve.codec_*`) and the program argument each one is; `codec_bounded_shapes`
# is `shape_bounds` from the calls' bounds (`VoxServeConfig.codec_call_bounds`)
FORM_ARGUMENTS = {
    "codec_channels_last": "channels_last", "codec_gemm_low_rate_convs": "gemm_low_rate_convs",
    "codec_gemm_wide_dilated_convs": "gemm_wide_dilated_convs",
    "codec_gemm_dilated_min_channels": "gemm_dilated_min_channels", "codec_rows_per_call": "rows_per_call",
    "codec_conv_kernels": "conv_kernels", "codec_layout_optimization": "layout_optimization",
    "codec_dynamic_frames": "dynamic_frames", "codec_conv_1x1_as_mm": "conv_1x1_as_mm", "codec_conv_tma": "conv_tma",
}


def form_arguments(settings) -> dict:
    """Qwen3CodecProgram's form arguments from the settings named as the config's (a mapping, or an object with
    them as attributes: the config, parsed flags)."""
    get = settings.__getitem__ if isinstance(settings, dict) else lambda key: getattr(settings, key)
    return {argument: get(key) for key, argument in FORM_ARGUMENTS.items()}


class Qwen3CodecProgram:
    """Adapts `decode_chunk` (codes [B, F, 16] -> wav [B, F*1920]) to the lanes' protocol."""

    def __init__(self, decoder: CodecDecoder, state_dtype: torch.dtype = torch.float32,
                 output_sample_rate: int = 24000, compile: bool = False, dynamic_frames: bool = True,
                 channels_last: bool = False, gemm_low_rate_convs: bool = False,
                 gemm_wide_dilated_convs: bool = False, rows_per_call: int = 0,
                 gemm_dilated_min_channels: int = 512, conv_kernels: str = "off", conv_tma: bool = False,
                 layout_optimization: bool = True, conv_1x1_as_mm: bool = False,
                 shape_bounds: tuple[int, int] | None = None) -> None:
        """`channels_last`: run the decoder's convs channels-last (`layers.use_channels_last`; changes `decoder`).
        `gemm_low_rate_convs`: its convs before the upsampling (`low_rate_convs`) as matmuls (`layers.use_gemm`;
        changes `decoder`). `gemm_wide_dilated_convs`: its dilated convs of at least
        `gemm_dilated_min_channels` channels (`wide_dilated_convs`) so.
        `rows_per_call`: decode a larger batch as calls of at most this many rows, one after another (0: one call).
        `conv_kernels`: its residual units on the Triton conv kernel (`layers.use_conv_kernels`: "tails", "dilated"
        or "all"; changes `decoder`; after the matmul forms above), or "off"; `conv_tma` the k7 convs so placed on the
        TMA kernel (`codec/tma_conv.py`).
        `layout_optimization`: inductor's choice of channels-last buffers around convs (its default); off, the compiled
        codec keeps every buffer as the modules make it. `conv_1x1_as_mm`: inductor lowers the compiled codec's 1x1
        convs to matmuls (its `conv_1x1_as_mm`).
        `shape_bounds`: (most rows, most frames) of the calls the compiled graph serves with bounded dynamic sizes
        (larger calls get a graph of their own): inductor proves 32-bit indexing from the bounds instead of taking
        the first call's sizes and guarding on them. `dynamic_frames=False` compiles a graph per chunk length, whose
        kernels index by constant sizes (the H200 ran a SnakeBeta pass with static sizes 3.4-3.8x faster than the
        same pass in the dynamic codec: results/h200/2026-12-02_session13)."""
        if rows_per_call < 0:
            raise ValueError(f"rows_per_call must be >= 0, got {rows_per_call}")
        if channels_last:
            use_channels_last(decoder)
        if gemm_low_rate_convs:
            use_gemm(decoder.low_rate_convs())
        if gemm_wide_dilated_convs:
            use_gemm(decoder.wide_dilated_convs(gemm_dilated_min_channels))
        if conv_kernels not in CONV_KERNELS:
            raise ValueError(f"conv_kernels must be one of {CONV_KERNELS}, got {conv_kernels!r}")
        if conv_kernels != "off":
            use_conv_kernels(decoder, conv_kernels, tma=conv_tma)
        self.decoder = decoder
        # torch.compile fuses the decoder's element-wise work (SnakeBeta alone is seven kernels) and the packing of
        # its new state. Compiled on first use with the batch size and (dynamic_frames) the chunk length dynamic: one
        # graph serves every batch and every length >= 2. torch.compile specialises size 1, so a lone row runs beside
        # a copy of itself (`_step`): a second compile of the whole codec cost 2 of a GPU server's start-up minutes.
        self.layout = StateLayout.of(decoder.config, state_dtype)
        options = {**({} if layout_optimization else {"layout_optimization": False}),
                   **({"conv_1x1_as_mm": True} if conv_1x1_as_mm else {})}
        self._compiled = torch.compile(self._decode_and_pack, backend=_OwnInductor(None, options, None)) \
            if compile else None
        self._dynamic_dims = ((0, 2) if dynamic_frames else (0,), (0,), (0,))  # codes [B, Q, F], position, block
        self.dynamic_frames = dynamic_frames
        if shape_bounds is not None and min(shape_bounds) < 2:
            raise ValueError(f"shape_bounds must be at least (2, 2), got {shape_bounds}")
        self.shape_bounds = shape_bounds
        self.state_dtype = state_dtype
        # The H200 times channels-last convs 1.5x faster than the plain ones at 16 chunks and 13x slower at 64 (one
        # cuDNN kernel; results/h200/2026-12-01_session11): capped rows keep the kernels of the fast batch.
        self.rows_per_call = rows_per_call
        self.samples_per_frame = decoder.config.samples_per_frame
        self.codes_per_frame = decoder.config.num_quantizers
        self.frame_rate_hz = output_sample_rate / self.samples_per_frame

    def make_state_pool(self, num_slots: int, device: torch.device) -> CodecStatePool:
        return CodecStatePool(self.decoder.config, num_slots, self.state_dtype, device, self.layout)

    def decode(self, codes: torch.Tensor, slots: torch.Tensor, pool: CodecStatePool) -> torch.Tensor:
        step = self._step if self._compiled else None
        rows = self.rows_per_call or codes.shape[0]
        if codes.shape[0] <= rows:
            return decode_chunk(self.decoder, codes, slots, pool, step).float()
        # rows are independent (each reads and writes only its own slot): the calls may split the batch anywhere
        return torch.cat([decode_chunk(self.decoder, codes[i:i + rows], slots[i:i + rows], pool, step)
                          for i in range(0, codes.shape[0], rows)]).float()

    def _decode_and_pack(self, codes: torch.Tensor, position: torch.Tensor, block: torch.Tensor):
        return decode_and_pack(self.decoder, self.layout, codes, position, block)

    def _step(self, codes: torch.Tensor, position: torch.Tensor, block: torch.Tensor):
        # Contiguous codes: as a view of an executable's static buffer their strides follow the buffer's longest chunk,
        # which the graph's guards tie to this call's length, so every other length compiled the codec again.
        codes = codes.contiguous()
        lone = codes.shape[0] == 1
        if lone:  # batch 1 as batch 2: the compiled graph never sees size 1 (rows are independent; the copy is dropped)
            codes, position, block = _twice(codes), _twice(position), _twice(block)
        bounds = self.shape_bounds
        bounded = bounds is not None and codes.shape[0] <= bounds[0] and 2 <= codes.shape[2] <= bounds[1]
        for t, dims in zip((codes, position, block), self._dynamic_dims, strict=True):
            for dim in dims:
                if bounded:  # (batch 1 runs as 2 above)
                    torch._dynamo.mark_dynamic(t, dim, min=2, max=bounds[0] if dim == 0 else bounds[1])
                else:
                    torch._dynamo.maybe_mark_dynamic(t, dim)
        if not self.dynamic_frames:  # one graph per chunk length: dynamo would make the length dynamic at the second
            torch._dynamo.mark_static(codes, 2)
        wav, position, block = self._compiled(codes, position, block)
        return (wav[:1], position[:1], block[:1]) if lone else (wav, position, block)


class _OwnInductor(torch._TorchCompileInductorWrapper):
    """Inductor as one program's own backend. Dynamo hands a cached graph of this function to any caller whose guards
    pass and whose backend compares equal, and two inductor backends with the same options do: a second program of a
    form the guards do not see (its chunk length static) ran the first program's dynamic graphs (the H200 timed it as
    the same kernels, session 14)."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _twice(t: torch.Tensor) -> torch.Tensor:
    """A batch-1 tensor as two copies of its row, in its own strides (the compiled graph guards on strides)."""
    out = torch.empty_strided((2, *t.shape[1:]), t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t.expand(2, *t.shape[1:]))
