"""The GPU worker's start-up order (vLLM's own start-up is stubbed: this runs on CPU)."""

from types import SimpleNamespace

import pytest
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
    worker.vllm_config = SimpleNamespace(additional_config={"voxserve": {"lanes": {"backbone_priority": "least"}}})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as on a machine with cores to spare
    try:
        worker.init_device()
    finally:
        torch.set_num_threads(threads)
    assert seen == [("cache", 1), ("vllm", 1)]
    assert worker.backbone_capture_stream is None  # the least priority keeps vLLM's own streams


def test_the_worker_hands_the_model_its_model_runner_v2_state(monkeypatch):
    """The model imports nothing of the worker: Model Runner V2 gets our state class from what the worker set."""
    from vllm_voxserve.models.qwen3_tts.vllm_model import Qwen3TTSForVllm
    from vllm_voxserve.worker.mrv2_state import SpeechModelState

    monkeypatch.setattr(Qwen3TTSForVllm, "model_state_cls", None)
    with pytest.raises(RuntimeError, match="voxserve GPU worker"):
        Qwen3TTSForVllm.get_model_state_cls()
    monkeypatch.setattr(gpu_worker, "load_compile_cache", lambda path: None)
    monkeypatch.setattr(Worker, "init_device", lambda self: None)
    worker = VoxServeGPUWorker.__new__(VoxServeGPUWorker)
    worker.model_runner = object()
    worker.vllm_config = SimpleNamespace(additional_config={"voxserve": {"lanes": {"backbone_priority": "least"}}})
    worker.init_device()
    assert Qwen3TTSForVllm.get_model_state_cls() is SpeechModelState


def test_a_high_backbone_priority_sets_the_current_stream_after_vllm_made_its_runner(monkeypatch):
    """Model Runner V2 caches the current stream as its main stream at first use: ours must be current by then."""
    seen = []
    monkeypatch.setattr(gpu_worker, "load_compile_cache", lambda path: None)
    monkeypatch.setattr(Worker, "init_device", lambda self: seen.append("vllm"))
    monkeypatch.setattr(gpu_worker, "backbone_streams", lambda setting: seen.append(setting) or "capture")
    worker = VoxServeGPUWorker.__new__(VoxServeGPUWorker)
    worker.model_runner = object()
    worker.vllm_config = SimpleNamespace(additional_config={"voxserve": {"lanes": {"backbone_priority": "high"}}})
    worker.init_device()
    assert seen == ["vllm", "high"] and worker.backbone_capture_stream == "capture"


def test_the_least_backbone_priority_touches_no_stream():
    assert gpu_worker.backbone_streams("least") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_high_backbone_priority_runs_the_thread_and_its_captures_above_the_least():
    least, _ = torch.cuda.Stream.priority_range()
    before = torch.cuda.current_stream()
    try:
        capture = gpu_worker.backbone_streams("high")
        assert torch.cuda.current_stream().priority < least and capture.priority == torch.cuda.current_stream().priority
        assert capture != torch.cuda.current_stream()
    finally:
        torch.cuda.set_stream(before)


@pytest.mark.parametrize("capture_stream, expected", [("priority stream", ["on priority stream", "vllm"]),
                                                      (None, ["vllm"])])
def test_vllm_captures_its_graphs_on_the_backbone_priority_stream(monkeypatch, capture_stream, expected):
    from contextlib import contextmanager

    from vllm_voxserve.config import LanesConfig

    seen = []

    @contextmanager
    def capture_on(stream):
        seen.append(f"on {stream}")
        yield

    monkeypatch.setattr(gpu_worker, "capture_vllm_graphs_on", capture_on)
    monkeypatch.setattr(Worker, "compile_or_warm_up_model", lambda self: seen.append("vllm") or "warm")
    worker = VoxServeGPUWorker.__new__(VoxServeGPUWorker)
    worker.model_runner = object()
    worker.lanes_config, worker.backbone_capture_stream = LanesConfig(), capture_stream
    assert worker._compile_or_warm_up() == "warm" and seen == expected


@pytest.mark.parametrize("method", ["MODE_RPC_METHOD", "CANCEL_RPC_METHOD", "STATS_RPC_METHOD", "TEXT_RPC_METHOD"])
def test_both_workers_answer_every_rpc_of_the_contract_from_their_own_runner(method):
    """vLLM resolves a collective_rpc by name on the worker: each contract name must reach the worker's runner."""
    from vllm_voxserve import contract
    from vllm_voxserve.worker.cpu_worker import VoxServeCPUWorker

    name = getattr(contract, method)
    args = {"MODE_RPC_METHOD": (None,), "CANCEL_RPC_METHOD": ([],), "STATS_RPC_METHOD": (),
            "TEXT_RPC_METHOD": ("stream", 0, [], "open")}[method]
    for worker_class in (VoxServeGPUWorker, VoxServeCPUWorker):
        worker = worker_class.__new__(worker_class)
        worker.model_runner = SimpleNamespace(speech=None, model_state=None)  # not loaded yet: a 503 reply
        reply = getattr(worker, name)(*args)
        assert reply["status"] == 503 and "no speech runtime" in reply["error"]


def _worker_measuring(monkeypatch, measured: int, held: int, kv_cache_memory_bytes=None, v2=True):
    monkeypatch.setattr(Worker, "determine_available_memory", lambda self: measured)
    worker = VoxServeGPUWorker.__new__(VoxServeGPUWorker)
    speech = SimpleNamespace(device_bytes=held)
    worker.model_runner = SimpleNamespace(model_state=SimpleNamespace(speech=speech)) if v2 else \
        SimpleNamespace(speech=speech)
    worker.cache_config = SimpleNamespace(kv_cache_memory_bytes=kv_cache_memory_bytes)
    return worker


@pytest.mark.parametrize("v2", [True, False])
def test_the_kv_cache_leaves_room_for_the_memory_the_speech_runtime_holds(monkeypatch, v2):
    """vLLM's profile counts its weights and its profile run, not the codec lanes built between them: without taking
    them off, the KV cache filled the whole share and the lanes' graphs came on top of it."""
    GiB = 1 << 30
    worker = _worker_measuring(monkeypatch, measured=60 * GiB, held=13 * GiB, v2=v2)
    assert worker.determine_available_memory() == 47 * GiB
    assert worker.available_kv_cache_memory_bytes == 47 * GiB  # vLLM's own summary line reads it later
    worker = _worker_measuring(monkeypatch, measured=10 * GiB, held=13 * GiB, v2=v2)
    assert worker.determine_available_memory() == 0  # vLLM then says there is no memory for the cache


def test_an_explicit_kv_cache_size_wins_over_the_speech_runtimes_memory(monkeypatch):
    GiB = 1 << 30
    worker = _worker_measuring(monkeypatch, measured=20 * GiB, held=13 * GiB, kv_cache_memory_bytes=20 * GiB)
    assert worker.determine_available_memory() == 20 * GiB
    worker = _worker_measuring(monkeypatch, measured=20 * GiB, held=0)  # a CPU-built or absent runtime
    assert worker.determine_available_memory() == 20 * GiB
