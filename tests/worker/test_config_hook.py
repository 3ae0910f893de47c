import types

import pytest

from vllm_voxserve.models.qwen3_tts.model_files import CheckpointFilesMissing
from vllm_voxserve.worker.config_hook import SCHEDULER, VoxServeConfigHook

# the files the server reads (the hook checks that they exist, not what they hold)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json",
                    "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors")


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint")
    for name in CHECKPOINT_FILES:
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text("{}")
    return root


@pytest.fixture(autouse=True)
def _complete_checkpoint_by_default(checkpoint_dir, monkeypatch):
    monkeypatch.setitem(globals(), "MODEL_DIR", checkpoint_dir)


def _vllm_config(max_num_seqs, voxserve=None, cudagraph_mode=None, model=None):
    return types.SimpleNamespace(
        load_config=types.SimpleNamespace(download_dir=None),
        compilation_config=types.SimpleNamespace(cudagraph_mode=cudagraph_mode, max_cudagraph_capture_size=None,
                                                 cudagraph_capture_sizes=None),
        additional_config={"voxserve": voxserve or {}},
        parallel_config=types.SimpleNamespace(worker_cls="auto"),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs, scheduler_cls=None),
        model_config=types.SimpleNamespace(skip_tokenizer_init=False, model=str(model or MODEL_DIR), revision=None),
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


def test_a_checkpoint_missing_files_is_refused_at_start_naming_them(checkpoint_dir, tmp_path):
    for name in CHECKPOINT_FILES:
        if name not in ("vocab.json", "speech_tokenizer/model.safetensors"):
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text("{}")
    with pytest.raises(CheckpointFilesMissing) as err:
        VoxServeConfigHook.verify_and_update_config(_vllm_config(64, model=tmp_path))
    assert "vocab.json, speech_tokenizer/model.safetensors;" in str(err.value)
