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


def _vllm_config(max_num_seqs, voxserve=None, cudagraph_mode=None, model=None, internal=None):
    return types.SimpleNamespace(
        load_config=types.SimpleNamespace(download_dir=None),
        compilation_config=types.SimpleNamespace(cudagraph_mode=cudagraph_mode, max_cudagraph_capture_size=None,
                                                 cudagraph_capture_sizes=None),
        additional_config={"voxserve": voxserve or {}, **({"voxserve_internal": internal} if internal else {})},
        parallel_config=types.SimpleNamespace(worker_cls="auto"),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs, scheduler_cls=None),
        model_config=types.SimpleNamespace(skip_tokenizer_init=False, model=str(model or MODEL_DIR), revision=None),
        cache_config=types.SimpleNamespace(enable_prefix_caching=True))


def test_running_requests_are_capped_at_the_codec_slots():
    config = _vllm_config(300, {"max_codec_slots": 8})  # the user's cap past the user's slots
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 8


def _on(monkeypatch, kind, sms=None, memory=None, vllm_caps=(256, 1024, 2048)):
    """Device facts, and the caps vLLM picks by itself there (EngineArgs.get_batch_defaults on that device)."""
    from vllm_voxserve.worker import config_hook

    monkeypatch.setattr(config_hook, "_device_facts", lambda platform: (kind, sms, memory))
    monkeypatch.setattr(config_hook, "_vllm_default_caps", lambda vllm_config: set(vllm_caps))


@pytest.mark.parametrize("max_num_seqs", [None, 1024, 2048])  # vLLM's defaults on a large GPU (throughput mode)
def test_vllm_default_cap_becomes_the_derived_one(monkeypatch, max_num_seqs):
    _on(monkeypatch, "cuda", 132, 141 * 10**9)
    config = _vllm_config(max_num_seqs)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 384
    assert config.additional_config["voxserve"]["max_codec_slots"] == 512
    assert config.additional_config["voxserve"]["scheduler"]["max_decode_batch"] == 384
    assert config.additional_config["voxserve_internal"]["scheduler"]["cost_seed"] == "h200"


def test_a_smaller_gpu_gets_smaller_sizes(monkeypatch):
    _on(monkeypatch, "cuda", 58, 24 * 10**9)
    config = _vllm_config(256)  # vLLM's default on a GPU under 70 GiB
    VoxServeConfigHook.verify_and_update_config(config)
    rows = config.scheduler_config.max_num_seqs
    assert 32 <= rows < 384
    assert config.additional_config["voxserve"]["scheduler"]["max_decode_batch"] == rows
    assert rows < config.additional_config["voxserve"]["max_codec_slots"] < 512


def test_explicit_settings_win(monkeypatch):
    _on(monkeypatch, "cuda", 132, 141 * 10**9)
    config = _vllm_config(300, {"max_codec_slots": 320, "scheduler": {"max_decode_batch": 200}},
                          internal={"scheduler": {"cost_seed": "paper_h100"}})
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 300
    assert config.additional_config["voxserve_internal"]["scheduler"]["cost_seed"] == "paper_h100"
    assert config.additional_config["voxserve"]["max_codec_slots"] == 320
    assert config.additional_config["voxserve"]["scheduler"]["max_decode_batch"] == 200


def test_the_cpu_keeps_small_sizes():
    config = _vllm_config(128)  # this machine: the real device facts and vLLM's CPU default
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.max_num_seqs == 128
    assert config.additional_config["voxserve"]["scheduler"]["max_decode_batch"] == 128


@pytest.mark.parametrize("max_num_seqs", [None, 256])
def test_the_hook_picks_our_scheduler(max_num_seqs):
    config = _vllm_config(max_num_seqs)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.scheduler_config.scheduler_cls == SCHEDULER
    assert config.model_config.skip_tokenizer_init and not config.cache_config.enable_prefix_caching


@pytest.mark.parametrize("on_cpu", [True, False])
def test_steps_with_prefills_get_whole_graphs_on_gpu_unless_the_user_chose(monkeypatch, on_cpu):
    from vllm.config import CUDAGraphMode
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: on_cpu)
    # vLLM's own streams: a GPU setting that needs no capture-stream hooks, which only some vLLMs have
    lanes = {"lanes": {"backbone_priority": "least"}}
    config = _vllm_config(64, lanes)
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.compilation_config.cudagraph_mode == (None if on_cpu else CUDAGraphMode.FULL)
    assert config.compilation_config.max_cudagraph_capture_size == (None if on_cpu else 512)
    chosen = _vllm_config(64, lanes, cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
    VoxServeConfigHook.verify_and_update_config(chosen)
    assert chosen.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert chosen.compilation_config.max_cudagraph_capture_size is None


def test_device_facts_come_from_nvml_without_cuda(monkeypatch):
    """SMs from NVML's core count (NVML has no SM count) and the capability's cores per SM; memory from vLLM."""
    import vllm.utils.import_utils as import_utils

    from vllm_voxserve.worker.config_hook import _device_facts

    calls = []
    nvml = types.SimpleNamespace(nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("down"),
                                 nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
                                 nvmlDeviceGetNumGpuCores=lambda handle: 16896 if handle == ("gpu", 3) else 0)
    monkeypatch.setattr(import_utils, "import_pynvml", lambda: nvml)
    h200 = types.SimpleNamespace(is_cpu=lambda: False, is_cuda=lambda: True,
                                 get_device_total_memory=lambda: 150_000_000_000,
                                 get_device_capability=lambda: types.SimpleNamespace(major=9, minor=0),
                                 device_id_to_physical_device_id=lambda device: 3)
    assert _device_facts(h200) == ("cuda", 132, 150_000_000_000)
    assert calls == ["init", "down"]
    broken = types.SimpleNamespace(**{**vars(h200), "get_device_total_memory": lambda: 1 / 0})
    monkeypatch.setattr(import_utils, "import_pynvml", lambda: 1 / 0)
    assert _device_facts(broken) == ("cuda", None, None)  # unknown facts, no crash: the defaults assume a large GPU


def test_a_checkpoint_missing_files_is_refused_at_start_naming_them(checkpoint_dir, tmp_path):
    for name in CHECKPOINT_FILES:
        if name not in ("vocab.json", "speech_tokenizer/model.safetensors"):
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text("{}")
    with pytest.raises(CheckpointFilesMissing) as err:
        VoxServeConfigHook.verify_and_update_config(_vllm_config(64, model=tmp_path))
    assert "vocab.json, speech_tokenizer/model.safetensors;" in str(err.value)


@pytest.mark.parametrize("voxserve, key", [({"codec_conv_kernels": "off"}, "codec_conv_kernels"),
                                           ({"lanes": {"lm_partition": True}}, "lm_partition"),
                                           ({"scheduler": {"forced_admission": "oldest"}}, "forced_admission")])
def test_a_removed_key_is_refused_at_start_naming_it(voxserve, key):
    """Start-up (vLLM's config check) fails at once, before anything is built, with one error naming the key."""
    with pytest.raises(ValueError, match=f"unknown .*[.']{key}'"):
        VoxServeConfigHook.verify_and_update_config(_vllm_config(64, voxserve=voxserve))


def test_an_internal_field_is_refused_among_the_settings_and_taken_in_its_own_section():
    with pytest.raises(ValueError, match=r"voxserve keys \['lanes.use_graphs'\] are internal"):
        VoxServeConfigHook.verify_and_update_config(_vllm_config(64, {"lanes": {"use_graphs": False}}))
    config = _vllm_config(64, internal={"lanes": {"use_graphs": False}})
    VoxServeConfigHook.verify_and_update_config(config)
    assert config.additional_config["voxserve_internal"]["lanes"] == {"use_graphs": False}


def test_a_vllm_whose_hooks_differ_stops_before_any_engine_process_starts(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_voxserve import vllm_hooks

    monkeypatch.setattr(Scheduler, "update_from_output", lambda self, scheduler_output: None)
    config = _vllm_config(None)
    with pytest.raises(vllm_hooks.UnsupportedVllm, match="Scheduler.update_from_output: takes \\(scheduler_output\\)"):
        VoxServeConfigHook.verify_and_update_config(config)
    assert config.parallel_config.worker_cls == "auto"  # nothing was chosen
