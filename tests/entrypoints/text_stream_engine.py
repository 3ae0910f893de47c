"""A real vLLM engine (AsyncLLM: engine core and worker processes, the plugin's scheduler and worker) with the speech
service in this process, for tests of streaming text in that need no route."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ENVIRONMENT = {"VLLM_PLUGINS": "voxserve", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
ENGINE_ARGS = dict(max_model_len=2048, max_num_seqs=16, kv_cache_memory_bytes=128 << 20, enforce_eager=True,
                   dtype="float32", served_model_name=["tiny"])


@contextlib.asynccontextmanager
async def speech_engine(checkpoint: Path, **engine_args):
    """Yield a started `SpeechService` on an in-process AsyncLLM serving `checkpoint` (CPU); `engine_args` add to or
    replace `ENGINE_ARGS`. The plugin must be importable through its entry points (`scripts/register_without_pip.sh`
    or an install)."""
    saved = {name: os.environ.get(name) for name in ENVIRONMENT}
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)  # the engine's processes inherit them
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_voxserve.config import process_config
    from vllm_voxserve.entrypoints.speech_service import SpeechService

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(checkpoint), **{**ENGINE_ARGS, **engine_args}))
    try:
        service = SpeechService(engine, str(checkpoint), ["tiny"],
                                process_config(engine.vllm_config.additional_config))
        service.start()
        yield service
    finally:
        engine.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
