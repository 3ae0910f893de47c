"""vLLM's CPU worker with our model runner (vLLM 0.26 builds its runner inline in `init_device`)."""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_voxserve.worker.codec_mode_rpc import codec_mode_call
from vllm_voxserve.worker.v1_runner import VoxServeCPUModelRunner


class VoxServeCPUWorker(CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        self.model_runner = VoxServeCPUModelRunner(self.vllm_config, torch.device("cpu"))

    def voxserve_codec_mode(self, mode: str | None = None) -> dict:
        """`collective_rpc` target (codec_mode_rpc.RPC_METHOD): report, and with `mode` switch, the codec mode."""
        return codec_mode_call(self.model_runner, mode)
