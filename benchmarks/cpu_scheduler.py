"""vLLM's real `Scheduler` with our policy (`scheduler.adapter.make_scheduler`) on CPU, with no model or KV cache
behind it and its clocks on a fake clock: what the scheduler host-time benchmark and the scheduler tests drive.

The benchmark also runs at older commits (copied there with this module), so only what both layouts of the plugin
have is imported here.
"""

from __future__ import annotations

import types

import torch
from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from vllm_voxserve.scheduler.adapter import make_scheduler

# Speech requests use no grammars (older vLLMs ask should_advance, newer ones accept_tokens).
NO_GRAMMARS = types.SimpleNamespace(should_advance=lambda request: False, accept_tokens=lambda request, ids: True)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cpu_scheduler(additional_config: dict, max_num_seqs: int, blocks: int, async_scheduling: bool = False):
    """(scheduler, clock): a 4096-token context, chunked prefill, 16-token blocks, `blocks` of them in one
    full-attention group; the scheduler's clock and wall clock are `clock`, so arrival times are on it too."""
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=4096, max_model_len=4096,
                                       is_encoder_decoder=False, enable_chunked_prefill=True,
                                       async_scheduling=async_scheduling)
    cache_config = CacheConfig(block_size=16, enable_prefix_caching=False)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                             additional_config=additional_config)
    # The facts of a text-only generating model that the scheduler reads, on every vLLM of the tested range (newer
    # ones read more of them).
    model = types.SimpleNamespace(is_encoder_decoder=False, max_model_len=4096, is_diffusion=False,
                                  enable_return_routed_experts=False, runner_type="generate", uses_mrope=False,
                                  multimodal_config=None, supports_multimodal_inputs=False,
                                  return_sampling_mask=False)
    object.__setattr__(vllm_config, "model_config", model)
    scheduler_config.async_scheduling = async_scheduling  # vLLM's CPU platform turned it off; GPUs keep it on
    cache_config.num_gpu_blocks = blocks
    kv_cache_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    no_mm = types.SimpleNamespace(supports_multimodal_inputs=lambda model_config: False)
    scheduler = make_scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                               structured_output_manager=NO_GRAMMARS, block_size=16, mm_registry=no_mm)
    clock = FakeClock()
    scheduler.clock = scheduler.wall_clock = clock
    return scheduler, clock
