"""The model-scoped config hook vLLM runs while it builds its config (API-server process, before the platform
fills in defaults): picks our worker and scheduler, turns off what cannot work for speech, validates our config."""

from __future__ import annotations

import logging
import os

from vllm.model_executor.models.config import VerifyAndUpdateConfig

from vllm_voxserve import vllm_hooks
from vllm_voxserve.config import ADDITIONAL_CONFIG_KEY, INTERNAL_CONFIG_KEY, VoxServeConfig, process_config
from vllm_voxserve.serving_defaults import cores_per_sm, derive_serving_defaults, is_vllm_default
from vllm_voxserve.models.qwen3_tts.model_files import resolve_and_check

logger = logging.getLogger(__name__)

CPU_WORKER = "vllm_voxserve.worker.cpu_worker.VoxServeCPUWorker"
GPU_WORKER = "vllm_voxserve.worker.gpu_worker.VoxServeGPUWorker"
# A dotted qualname (vLLM resolves scheduler_cls with resolve_obj_by_qualname, not "module:attr").
SCHEDULER = "vllm_voxserve.scheduler.adapter.make_scheduler"


class VoxServeConfigHook(VerifyAndUpdateConfig):
    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        from vllm.platforms import current_platform

        config = process_config(vllm_config.additional_config)  # fail fast on bad keys
        # Before any process starts: a vLLM whose hooks differ stops here with one message, not inside a step.
        vllm_hooks.check_hooks(vllm_hooks.serving_uses(current_platform.is_cpu(), config.lanes))
        # Fail fast, naming every missing file, rather than at the first file some later step opens (an absent
        # vocab.json surfaces as a sentencepiece/tiktoken error from transformers). A hub id resolves through the
        # hub cache (downloaded there first unless HF_HUB_OFFLINE is set).
        model_config = vllm_config.model_config
        resolve_and_check(model_config.model, model_config.revision, vllm_config.load_config.download_dir)
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = CPU_WORKER if current_platform.is_cpu() else GPU_WORKER
        scheduler = vllm_config.scheduler_config
        config = _apply_serving_defaults(vllm_config, current_platform)
        max_seqs = getattr(scheduler, "max_num_seqs", None)
        if max_seqs is not None and max_seqs > config.max_codec_slots:
            # Each running request holds a codec state slot: past them, an inline-mode request would fail at its
            # first step, so a user's cap past the slots is lowered rather than refused.
            logger.warning("voxserve: --max-num-seqs %d lowered to voxserve.max_codec_slots %d", max_seqs,
                           config.max_codec_slots)
            scheduler.max_num_seqs = config.max_codec_slots
        if scheduler.scheduler_cls is None:  # a user's --scheduler-cls wins
            scheduler.scheduler_cls = SCHEDULER
        compilation = getattr(vllm_config, "compilation_config", None)
        if not current_platform.is_cpu() and compilation is not None and compilation.cudagraph_mode is None:
            # One whole-step graph for steps that mix prefills with decodes too (the user's -cc.cudagraph_mode wins).
            # Under load most steps carry an arriving prompt, and vLLM's default runs those piecewise: the forward's
            # Python per layer took a quarter of the engine's thread at 60 req/s on the H200 (run 2026-12-01_a7fe391,
            # py-spy), the thread that bounds the step rate. FlashAttention 3 runs mixed batches in full graphs;
            # where the attention backend cannot, vLLM lowers the mode itself.
            from vllm.config import CUDAGraphMode

            compilation.cudagraph_mode = CUDAGraphMode.FULL
            if compilation.max_cudagraph_capture_size is None and compilation.cudagraph_capture_sizes is None:
                # graphs up to 512 tokens, not vLLM's 2 x max_num_seqs (256 at our 128): a full decode batch with
                # a few arriving prompts (~70 tokens each) still replays one graph instead of running eagerly (6 %
                # of the engine's thread in the same profile)
                compilation.max_cudagraph_capture_size = 512
        # vLLM must not treat the text tokenizer's ids (<|im_end|> = 151645 ...) as stop tokens of a 3072-id codec
        # vocabulary: the endpoint tokenizes text itself and stops on the codec EOS.
        vllm_config.model_config.skip_tokenizer_init = True
        # Prompts are placeholder ids of the plan's length: equal ids do not mean equal prompts.
        vllm_config.cache_config.enable_prefix_caching = False
        logger.info("voxserve: worker %s, scheduler %s, config %s", parallel.worker_cls, scheduler.scheduler_cls,
                    config.to_dict())


def _apply_serving_defaults(vllm_config, platform) -> VoxServeConfig:
    """Sizes the user left out, derived from the device and the model (`serving_defaults`), written into the
    additional config that every process parses (API server, engine core, workers), and into vLLM's running cap
    where that is vLLM's own default. Returns the config as it now parses."""
    kind, sms, memory = _device_facts(platform)
    derived = derive_serving_defaults(kind, sms, memory, _model_params(vllm_config.model_config))
    additional = vllm_config.additional_config
    if not isinstance(additional, dict):  # vLLM's field may be any hashable mapping: ours to extend, as a dict
        additional = dict(additional or {})
        vllm_config.additional_config = additional
    # the derived settings go where a user sets them, the derived internal field (the cost seed) where tests and
    # benchmarks do; either way a value already given wins
    settings = dict(additional.get(ADDITIONAL_CONFIG_KEY) or {})
    internal = dict(additional.get(INTERNAL_CONFIG_KEY) or {})
    policy = dict(settings.get("scheduler") or {})
    internal_policy = dict(internal.get("scheduler") or {})
    applied = []
    if "max_codec_slots" not in settings:
        settings["max_codec_slots"] = derived.max_codec_slots
        applied.append(f"max_codec_slots {derived.max_codec_slots}")
    if "max_decode_batch" not in policy:
        policy["max_decode_batch"] = derived.max_decode_batch
        applied.append(f"scheduler.max_decode_batch {derived.max_decode_batch}")
    if "cost_seed" not in internal_policy:
        internal_policy["cost_seed"] = derived.cost_seed
        applied.append(f"scheduler.cost_seed {derived.cost_seed}")
    settings["scheduler"], internal["scheduler"] = policy, internal_policy
    additional[ADDITIONAL_CONFIG_KEY], additional[INTERNAL_CONFIG_KEY] = settings, internal
    config = process_config(additional)
    scheduler = vllm_config.scheduler_config
    if is_vllm_default(getattr(scheduler, "max_num_seqs", None), _vllm_default_caps(vllm_config)):
        cap = min(derived.max_num_seqs, config.max_codec_slots)
        scheduler.max_num_seqs = cap
        applied.append(f"max_num_seqs {cap}")
    logger.info("voxserve: serving defaults %s; applied (not set by the user): %s", derived.describe(),
                ", ".join(applied) or "none")
    return config


def _vllm_default_caps(vllm_config) -> set[int]:
    """The running caps vLLM picks when `--max-num-seqs` is not given (EngineArgs: per usage context, doubled in
    throughput mode, at most max_num_batched_tokens)."""
    try:
        from vllm.engine.arg_utils import EngineArgs

        world_size = getattr(vllm_config.parallel_config, "world_size", 1) or 1
        caps = {c for c in EngineArgs.get_batch_defaults(world_size)[1].values() if c}
    except Exception:  # a vLLM without the helper: its documented fallback
        caps = {256, 1024}
    tokens = getattr(vllm_config.scheduler_config, "max_num_batched_tokens", None)
    caps |= {2 * c for c in caps}
    if tokens:
        caps |= {min(c, tokens) for c in caps}
    return caps


def _device_facts(platform) -> tuple[str, int | None, int | None]:
    """(kind, SMs, memory bytes) of device 0, without initializing CUDA in this process (NVML only)."""
    if platform.is_cpu() or not platform.is_cuda():
        return ("cpu" if platform.is_cpu() else str(getattr(platform, "device_type", "other"))), None, None
    memory = sms = None
    try:
        memory = int(platform.get_device_total_memory())
    except Exception:
        logger.warning("voxserve: device memory unknown; serving defaults assume enough")
    try:
        from vllm.utils.import_utils import import_pynvml

        pynvml = import_pynvml()
        capability = platform.get_device_capability()
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(platform.device_id_to_physical_device_id(0))
            per_sm = cores_per_sm(capability.major, capability.minor)
            sms = pynvml.nvmlDeviceGetNumGpuCores(handle) // per_sm if per_sm else None
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        logger.warning("voxserve: SM count unknown; serving defaults assume a large GPU")
    return "cuda", sms, memory


def _model_params(model_config) -> int | None:
    """Parameters of a local checkpoint, from its safetensors' size at 2 bytes a parameter (None elsewhere)."""
    path = getattr(model_config, "model", None)
    if not isinstance(path, str) or not os.path.isdir(path):
        return None
    total = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
    return total // 2 or None
