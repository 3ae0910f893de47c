"""vLLM general plugin: registers the speech models, their configs and the hook that picks our worker.

vLLM calls `register()` in every process (API server, engine core, workers); it is idempotent and cheap.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# Architectures (from config.json "architectures") served by this plugin -> the vLLM model class.
MODEL_CLASSES = {
    "Qwen3TTSForConditionalGeneration": "vllm_voxserve.models.qwen3_tts.vllm_model:Qwen3TTSForVllm",
}

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_voxserve import compat, vllm_hooks

    vllm_hooks.check_hooks([vllm_hooks.REGISTRATION])  # before anything below touches them
    compat.log_through_vllm()
    compat.add_plugin_cli_flag()
    if compat.plugin_requested_on_command_line() and "VLLM_PLUGINS" not in os.environ:
        compat.allow_endpoint_plugin()
    _register_configs()
    _register_models()


def _register_configs() -> None:
    from transformers import AutoConfig

    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig

    model_type = Qwen3TTSConfig.model_type
    # vLLM resolves configs through its own table first (forces trust_remote_code=False) and then AutoConfig.
    _CONFIG_REGISTRY[model_type] = Qwen3TTSConfig
    try:
        AutoConfig.register(model_type, Qwen3TTSConfig, exist_ok=True)
    except TypeError:  # older transformers without exist_ok
        AutoConfig.register(model_type, Qwen3TTSConfig)


def _register_models() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from vllm_voxserve.worker.config_hook import VoxServeConfigHook

    for arch, qualname in MODEL_CLASSES.items():
        ModelRegistry.register_model(arch, qualname)
        # Model-scoped hook: picks our worker and scheduler without --worker-cls / --scheduler-cls.
        MODELS_CONFIG_MAP[arch] = VoxServeConfigHook
