"""vLLM's GPU worker for speech models. With Model Runner V2 (vLLM's default on GPU for this model) the model's
`get_model_state_cls` hook installs `SpeechModelState`, which this worker hands the model class before it loads;
the V1 runner gets the same speech hooks by subclassing."""

from __future__ import annotations

import logging
import os

import torch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from vllm_voxserve.compat import attach_step_report, capture_vllm_graphs_on
from vllm_voxserve.config import backbone_stream_priority, process_config
from vllm_voxserve.models.qwen3_tts.vllm_model import Qwen3TTSForVllm
from vllm_voxserve.worker.compile_cache import cache_path, load_compile_cache, save_compile_cache
from vllm_voxserve.worker.mrv2_state import SpeechModelState
from vllm_voxserve.worker.rpc import SpeechRpcTargets, speech_runtime
from vllm_voxserve.worker.v1_runner import V1SpeechHooks

logger = logging.getLogger(__name__)


class VoxServeV1GPUModelRunner(V1SpeechHooks, GPUModelRunner):
    pass


class VoxServeGPUWorker(SpeechRpcTargets, Worker):
    def init_device(self) -> None:
        # Both before the model loads, as the codec and the code predictor compile while it is built. The thread
        # count first: dynamo's guards hold it, so setting it after the compile made the inline codec's first call
        # compile the codec again (52-55 s per switch to `inline` or `vllm-stock`, run 2026-12-01_2a42666's serve logs).
        serve_on_one_intra_op_thread()
        load_compile_cache(cache_path())
        Qwen3TTSForVllm.model_state_cls = SpeechModelState  # asked for by Model Runner V2 when it loads the model
        super().init_device()
        if isinstance(self.model_runner, GPUModelRunner):  # the V1 runner (MRV2 is a different class)
            self.model_runner = VoxServeV1GPUModelRunner(self.vllm_config, self.device)
        self.lanes_config = process_config(self.vllm_config.additional_config).lanes
        self.backbone_capture_stream = backbone_streams(self.lanes_config.backbone_priority)

    def compile_or_warm_up_model(self):
        result = self._compile_or_warm_up()
        save_compile_cache(cache_path())  # everything has compiled by now
        return result

    def _compile_or_warm_up(self):
        """With `voxserve.lanes.backbone_priority` above the least, vLLM captures its graphs on a stream of that
        priority (`compat.capture_vllm_graphs_on`; a graph runs at its capture stream's priority)."""
        stream = self.backbone_capture_stream
        if stream is None:
            return super().compile_or_warm_up_model()
        with capture_vllm_graphs_on(stream):
            return super().compile_or_warm_up_model()

    def determine_available_memory(self) -> int:
        """vLLM sizes the KV cache to fill `gpu_memory_utilization`'s share less the weights and its profile run's
        peak; the speech runtime's memory (`SpeechRuntime.device_bytes`), built between the two, is in neither, so it
        came on top of the share: with `lanes.background_bucket_step` 8 (13 GiB of codec graphs) an 80 GB H100 ran
        out of device memory allocating the KV cache at 0.85 (results h100/2026-12-06_27762a8_bucket_step). An
        explicit `--kv-cache-memory` still wins."""
        available = super().determine_available_memory()
        speech = speech_runtime(self.model_runner)
        held = getattr(speech, "device_bytes", 0)
        if held <= 0 or self.cache_config.kv_cache_memory_bytes:
            return available
        kv_bytes = max(available - held, 0)
        logger.info("voxserve: the speech runtime holds %.2f GiB beside the weights (codec, its lanes' graphs and "
                    "state slots); KV cache memory %.2f GiB of the %.2f GiB vLLM measured", held / 2**30,
                    kv_bytes / 2**30, available / 2**30)
        self.available_kv_cache_memory_bytes = kv_bytes
        return kv_bytes

    def execute_model(self, scheduler_output):
        # Model Runner V2 removes preempted requests before the step: tell the speech side first (runtime.preempt)
        speech = getattr(getattr(self.model_runner, "model_state", None), "speech", None)
        if speech is not None:
            speech.preempt(scheduler_output.preempted_req_ids, scheduler_output.finished_req_ids)
        return super().execute_model(scheduler_output)

    def sample_tokens(self, grammar_output):
        """Model Runner V2: the speech step report rides on the step's output to the scheduler (the V1 runner attaches
        its own, `V1SpeechHooks.sample_tokens`). Costs are the device times of finished steps, not host timings."""
        output = super().sample_tokens(grammar_output)
        speech = getattr(getattr(self.model_runner, "model_state", None), "speech", None)
        if speech is not None:
            attach_step_report(output, lambda: speech.step_report(costs=False))
        return output



def serve_on_one_intra_op_thread() -> None:
    """The worker serves many small host steps on one thread. torch would fan a large CPU op out to a thread per
    core, and those threads spin between steps beside the engine's own (run 2026-12-01_a7fe391 on the H200, lanes
    mode: 15 of
    them at 23-35 % of a CPU each while the engine's thread was 80-94 % busy). OMP_NUM_THREADS, if set, wins."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def backbone_streams(setting: str) -> torch.cuda.Stream | None:
    """`lanes.backbone_priority` other than "least": make this thread's current stream one of that priority before
    the model runner first reads it (Model Runner V2 caches it as its main stream; vLLM's executor runs every worker
    call on this thread), and return a second stream of that priority for capturing vLLM's graphs. None: vLLM's own
    streams, at the least priority."""
    if setting == "least":
        return None
    least, greatest = torch.cuda.Stream.priority_range()
    priority = backbone_stream_priority(setting, least, greatest)
    torch.cuda.set_stream(torch.cuda.Stream(priority=priority))
    logger.info("voxserve: the backbone runs at stream priority %d (range %d..%d)", priority, least, greatest)
    return torch.cuda.Stream(priority=priority)
