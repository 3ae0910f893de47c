"""vLLM's CPU worker with our model runner (vLLM 0.26 builds its runner inline in `init_device`)."""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_voxserve.worker.rpc import cancel_audio_call, codec_mode_call, stats_call, text_call
from vllm_voxserve.worker.v1_runner import VoxServeCPUModelRunner


class VoxServeCPUWorker(CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        self.model_runner = VoxServeCPUModelRunner(self.vllm_config, torch.device("cpu"))

    def voxserve_codec_mode(self, mode: str | None = None) -> dict:
        """`collective_rpc` target (contract.MODE_RPC_METHOD): report, and with `mode` switch, the codec mode."""
        return codec_mode_call(self.model_runner, mode)

    def voxserve_cancel_audio(self, stream_keys: list[str]) -> dict:
        """`collective_rpc` target (contract.CANCEL_RPC_METHOD): end these streams' audio, their listeners left."""
        return cancel_audio_call(self.model_runner, stream_keys)

    def voxserve_text(self, stream_key: str, start: int, ids: list[int], state: str) -> dict:
        """`collective_rpc` target (contract.TEXT_RPC_METHOD): text of a text stream, in order."""
        return text_call(self.model_runner, stream_key, start, ids, state)

    def voxserve_stats(self) -> dict:
        """`collective_rpc` target (contract.STATS_RPC_METHOD): the engine's speech counters for /metrics."""
        return stats_call(self.model_runner)
