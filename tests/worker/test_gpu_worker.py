"""The GPU worker's start-up order (vLLM's own start-up is stubbed: this runs on CPU)."""

import torch
from vllm.v1.worker.gpu_worker import Worker

from vllm_voxserve.worker import gpu_worker
from vllm_voxserve.worker.gpu_worker import VoxServeGPUWorker


def test_one_intra_op_thread_and_the_compile_cache_come_before_the_model_compiles(monkeypatch):
    """dynamo guards the thread count: set after the codec compiled, the next new call compiled it all again."""
    seen = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(gpu_worker, "load_compile_cache", lambda path: seen.append(("cache", torch.get_num_threads())))
    monkeypatch.setattr(Worker, "init_device", lambda self: seen.append(("vllm", torch.get_num_threads())))
    worker = VoxServeGPUWorker.__new__(VoxServeGPUWorker)
    worker.model_runner = object()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as on a machine with cores to spare
    try:
        worker.init_device()
    finally:
        torch.set_num_threads(threads)
    assert seen == [("cache", 1), ("vllm", 1)]
