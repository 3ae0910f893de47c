import types

import pytest

from vllm_voxserve.worker.config_hook import SCHEDULER, VoxServeConfigHook


def _vllm_config(max_num_seqs, voxserve=None, cudagraph_mode=None):
    return types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(cudagraph_mode=cudagraph_mode, max_cudagraph_capture_size=None,
                                                 cudagraph_capture_sizes=None),
        additional_config={"voxserve": voxserve or {}},
        parallel_config=types.SimpleNamespace(worker_cls="auto"),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs, scheduler_cls=None),
        model_config=types.SimpleNamespace(skip_tokenizer_init=False),
        cache_config=types.SimpleNamespace(enable_prefix_caching=True))


def test_running_requests_are_capped_at_the_codec_slots():
    config = _vllm_config(1024, {"max_codec_slots": 8})  # vLLM's default on a large GPU
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 8


@pytest.mark.parametrize("max_num_seqs, voxserve, expected", [
    (1024, {}, 256),  # vLLM's large-GPU default becomes the default decode batch (384 slots)
    (1024, {"scheduler": {"max_decode_batch": 512}}, 384),  # never past the slots
    (300, {}, 300),  # a cap within the slots is the user's
])
def test_a_cap_past_the_slots_falls_to_the_decode_batch(max_num_seqs, voxserve, expected):
    config = _vllm_config(max_num_seqs, voxserve)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == expected


@pytest.mark.parametrize("max_num_seqs", [None, 256])
def test_the_hook_picks_our_scheduler_when_the_slots_suffice(max_num_seqs):
    config = _vllm_config(max_num_seqs)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == SCHEDULER
    assert config.scheduler_config.max_num_seqs == max_num_seqs
    assert config.model_config.skip_tokenizer_init and not config.cache_config.enable_prefix_caching


@pytest.mark.parametrize("on_cpu", [True, False])
def test_steps_with_prefills_get_whole_graphs_on_gpu_unless_the_user_chose(monkeypatch, on_cpu):
    from vllm.config import CUDAGraphMode
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: on_cpu)
    config = _vllm_config(64)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.compilation_config.cudagraph_mode == (None if on_cpu else CUDAGraphMode.FULL)
    assert config.compilation_config.max_cudagraph_capture_size == (None if on_cpu else 512)
    chosen = _vllm_config(64, cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
    VoxServeConfigHook.verify_and_update_config(chosen)
    assert chosen.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert chosen.compilation_config.max_cudagraph_capture_size is None
