import types

import pytest

from vllm_voxserve.worker.config_hook import SCHEDULER, VoxServeConfigHook


def _vllm_config(max_num_seqs, voxserve=None):
    return types.SimpleNamespace(
        additional_config={"voxserve": voxserve or {}},
        parallel_config=types.SimpleNamespace(worker_cls="auto"),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs, scheduler_cls=None),
        model_config=types.SimpleNamespace(skip_tokenizer_init=False),
        cache_config=types.SimpleNamespace(enable_prefix_caching=True))


def test_running_requests_are_capped_at_the_codec_slots():
    config = _vllm_config(1024, {"max_codec_slots": 8})  # vLLM's default on a large GPU
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 8


@pytest.mark.parametrize("max_num_seqs", [None, 256])
def test_the_hook_picks_our_scheduler_when_the_slots_suffice(max_num_seqs):
    config = _vllm_config(max_num_seqs)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == SCHEDULER
    assert config.scheduler_config.max_num_seqs == max_num_seqs
    assert config.model_config.skip_tokenizer_init and not config.cache_config.enable_prefix_caching
