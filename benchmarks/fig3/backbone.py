"""The backbone of Figure 3: one Qwen3-TTS decode step as the served model computes it, graph-capturable per batch.

Per step: the talker's decoder layers on one new token per request over a fixed context held in a static K/V cache
(`--context` positions; real shapes, fused QKV and gate/up weights, the same layer code as the served code
predictor), final norm, codec head and codebook 0 (greedy), then the served code-predictor frame
(`FusedCodePredictor`, compiled) for codebooks 1..15. Random weights, bf16. It is what one engine step computes,
without vLLM's paged cache, FlashAttention kernels and scheduler: a faithful load for SM-scaling and side-by-side
measurements, not vLLM's step time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.qwen3_tts.checkpoint import official_config
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.fused_code_predictor import FusedCodePredictor, fused_layer_weights, layer_pass
from vllm_voxserve.models.qwen3_tts.decoder_layers import rotary_cos_sin
from vllm_voxserve.models.qwen3_tts.talker import Talker


def backbone_step_factory(size: str = "1.7b", context: int = 256, device: str = "cuda",
                          dtype: torch.dtype = torch.bfloat16, compile: bool = True,
                          seed: int = 0) -> Callable[[int], Callable[[], torch.Tensor]]:
    """make_step(batch) -> step(): one decode step (talker + code predictor) for `batch` requests; returns the
    frame codes [batch, 16]. Each call of make_step allocates that batch's static inputs and caches."""
    config = Qwen3TTSConfig.from_dict(official_config(size, "custom_voice")).talker_config
    torch.manual_seed(seed)
    with torch.device(device):
        talker = Talker(config).to(dtype).eval()  # default (random) init, made on the device
    weights = [tuple(w.detach() for w in fused_layer_weights(layer)) for layer in talker.model.layers]
    cp = FusedCodePredictor(talker.code_predictor, VoxServeConfig().code_predictor_kernels)  # as served by default
    run_layer = torch.compile(layer_pass, fullgraph=True) if compile else layer_pass
    if compile:
        cp.compile()
    pos = context - 1  # the new token's position: it attends over the whole context
    cos, sin = (t[pos:pos + 1, None] for t in rotary_cos_sin(torch.arange(context, device=device),
                                                            config.head_dim, config.rope_theta, dtype))
    positions = torch.tensor([pos], device=device)
    kv_shape = (config.num_key_value_heads, config.head_dim)

    def make_step(batch: int) -> Callable[[], torch.Tensor]:
        gen = torch.Generator(device).manual_seed(batch)
        x = torch.randn(batch, 1, config.hidden_size, device=device, dtype=dtype, generator=gen)
        caches = [(torch.randn(batch, kv_shape[0], context, kv_shape[1], device=device, dtype=dtype, generator=gen),
                   torch.randn(batch, kv_shape[0], context, kv_shape[1], device=device, dtype=dtype, generator=gen))
                  for _ in weights]
        rows = dict(temperature=torch.full((batch,), 0.9, device=device), top_k=torch.full((batch,), 50,
                    device=device), top_p=torch.ones(batch, device=device),
                    seed=torch.arange(batch, device=device), frame_index=torch.zeros(batch, dtype=torch.long,
                                                                                      device=device))

        @torch.inference_mode()
        def step() -> torch.Tensor:
            h = x
            for (k_cache, v_cache), layer_weights in zip(caches, weights, strict=True):
                if compile:
                    for t in (h, k_cache, v_cache):
                        torch._dynamo.mark_dynamic(t, 0)
                h = run_layer(h, k_cache, v_cache, cos, sin, positions, *layer_weights,
                              config.num_attention_heads, config.rms_norm_eps)
            hidden = talker.model.norm(h[:, 0])
            c0 = F.linear(hidden, talker.codec_head.weight).argmax(dim=-1)
            rest = cp.frame(hidden, c0, **rows)
            return torch.cat([c0[:, None], rest], dim=1)

        return step

    return make_step
