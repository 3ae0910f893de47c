"""The model-scoped config hook vLLM runs while it builds its config (API-server process, before the platform
fills in defaults): picks our worker and scheduler, turns off what cannot work for speech, validates our config."""

from __future__ import annotations

import logging

from vllm.model_executor.models.config import VerifyAndUpdateConfig

from vllm_voxserve.config import VoxServeConfig
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

        config = VoxServeConfig.from_additional_config(vllm_config.additional_config)  # fail fast on bad keys
        # Fail fast, naming every missing file, rather than at the first file some later step opens (an absent
        # vocab.json surfaces as a sentencepiece/tiktoken error from transformers). A hub id resolves through the
        # hub cache (downloaded there first unless HF_HUB_OFFLINE is set).
        model_config = vllm_config.model_config
        resolve_and_check(model_config.model, model_config.revision, vllm_config.load_config.download_dir)
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = CPU_WORKER if current_platform.is_cpu() else GPU_WORKER
        scheduler = vllm_config.scheduler_config
        max_seqs = getattr(scheduler, "max_num_seqs", None)
        if max_seqs is not None and max_seqs > config.max_codec_slots:
            # Each running request holds a codec state slot: past them, an inline-mode request would fail at its
            # first step. vLLM's own default (1024 on large GPUs) lands here too, so clamp rather than refuse, to
            # the decode batch where the slots allow (the running cap the H200 capacity runs served with).
            decode_batch = config.scheduler_policy().max_decode_batch
            lowered = min(config.max_codec_slots, decode_batch)
            logger.warning("voxserve: --max-num-seqs %d lowered to %d (voxserve.max_codec_slots %d, "
                           "voxserve.scheduler.max_decode_batch %d)", max_seqs, lowered, config.max_codec_slots,
                           decode_batch)
            scheduler.max_num_seqs = lowered
        if scheduler.scheduler_cls is None:  # a user's --scheduler-cls wins
            scheduler.scheduler_cls = SCHEDULER
        compilation = getattr(vllm_config, "compilation_config", None)
        if not current_platform.is_cpu() and compilation is not None and compilation.cudagraph_mode is None:
            # One whole-step graph for steps that mix prefills with decodes too (the user's -cc.cudagraph_mode wins).
            # Under load most steps carry an arriving prompt, and vLLM's default runs those piecewise: the forward's
            # Python per layer took a quarter of the engine's thread at 60 req/s on the H200 (session 9, py-spy),
            # the thread that bounds the step rate. FlashAttention 3 runs mixed batches in full graphs; where the
            # attention backend cannot, vLLM lowers the mode itself.
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
