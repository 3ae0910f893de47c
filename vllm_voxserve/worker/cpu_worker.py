"""vLLM's CPU worker with our model runner (vLLM 0.26 builds its runner inline in `init_device`)."""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_voxserve.worker.rpc import SpeechRpcTargets
from vllm_voxserve.worker.v1_runner import VoxServeCPUModelRunner


class VoxServeCPUWorker(SpeechRpcTargets, CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        self.model_runner = VoxServeCPUModelRunner(self.vllm_config, torch.device("cpu"))

