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


def test_more_running_requests_than_codec_slots_fail_at_start_up_with_the_fix_named():
    with pytest.raises(ValueError, match="max_codec_slots 8: raise max_codec_slots or lower --max-num-seqs"):
        VoxServeConfigHook.verify_and_update_config(_vllm_config(16, {"max_codec_slots": 8}))


@pytest.mark.parametrize("max_num_seqs", [None, 256])
def test_the_hook_picks_our_scheduler_when_the_slots_suffice(max_num_seqs):
    config = _vllm_config(max_num_seqs)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == SCHEDULER
    assert config.model_config.skip_tokenizer_init and not config.cache_config.enable_prefix_caching
