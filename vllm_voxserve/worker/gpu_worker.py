"""vLLM's GPU worker for speech models. With Model Runner V2 (vLLM's default on GPU for this model) the model's
`get_model_state_cls` hook installs `SpeechModelState`; the V1 runner gets the same speech hooks by subclassing."""

from __future__ import annotations

import logging
import os

import torch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from vllm_voxserve.codec_lanes.partitions import SplitSpec, shared_partitions
from vllm_voxserve.compat import capture_vllm_graphs_on
from vllm_voxserve.config import VoxServeConfig, backbone_stream_priority
from vllm_voxserve.scheduler.adapter import attach_report
from vllm_voxserve.worker.compile_cache import cache_path, load_compile_cache, save_compile_cache
from vllm_voxserve.worker.rpc import cancel_audio_call, codec_mode_call, stats_call
from vllm_voxserve.worker.v1_runner import V1SpeechHooks

logger = logging.getLogger(__name__)


class VoxServeV1GPUModelRunner(V1SpeechHooks, GPUModelRunner):
    pass


class VoxServeGPUWorker(Worker):
    def init_device(self) -> None:
        # Both before the model loads, as the codec and the code predictor compile while it is built. The thread
        # count first: dynamo's guards hold it, so setting it after the compile made the inline codec's first call
        # compile the codec again (52-55 s per switch to `inline` or `vllm-stock`, session 10's serve logs).
        serve_on_one_intra_op_thread()
        load_compile_cache(cache_path())
        super().init_device()
        if isinstance(self.model_runner, GPUModelRunner):  # the V1 runner (MRV2 is a different class)
            self.model_runner = VoxServeV1GPUModelRunner(self.vllm_config, self.device)
        self.lanes_config = VoxServeConfig.from_additional_config(self.vllm_config.additional_config).lanes
        self.backbone_capture_stream = backbone_streams(self.lanes_config.backbone_priority)

    def compile_or_warm_up_model(self):
        result = self._compile_or_warm_up()
        save_compile_cache(cache_path())  # everything has compiled by now
        return result

    def _compile_or_warm_up(self):
        """vLLM captures its graphs on one of our streams (`compat.capture_vllm_graphs_on`): with
        `voxserve.lanes.backbone_priority` above the least, a stream of that priority (a graph runs at its capture
        stream's priority); with `voxserve.lanes.lm_partition` (Model Runner V2), the LM partition's green stream, and
        the codec lanes later take the complementary SMs of the same split. The config allows one of the two."""
        lanes, stream = self.lanes_config, self.backbone_capture_stream
        if stream is None and lanes.lm_partition and hasattr(self.model_runner, "cudagraph_manager"):  # MRV2 only
            partitions = shared_partitions(SplitSpec(lanes.split.group, lanes.split.group_sms, self.device.index or 0))
            logger.info("voxserve: capturing the backbone's CUDA graphs on the LM partition (%d of %d SMs)",
                        partitions.lm_sms, partitions.total_sms)
            stream = partitions.lm_stream
        if stream is None:
            return super().compile_or_warm_up_model()
        with capture_vllm_graphs_on(stream):
            return super().compile_or_warm_up_model()

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
            attach_report(output, lambda: speech.step_report(costs=False))
        return output

    def voxserve_codec_mode(self, mode: str | None = None) -> dict:
        """`collective_rpc` target (rpc.MODE_RPC_METHOD): report, and with `mode` switch, the codec mode."""
        return codec_mode_call(self.model_runner, mode)

    def voxserve_cancel_audio(self, stream_keys: list[str]) -> dict:
        """`collective_rpc` target (rpc.CANCEL_RPC_METHOD): end these streams' audio, their listeners left."""
        return cancel_audio_call(self.model_runner, stream_keys)

    def voxserve_stats(self) -> dict:
        """`collective_rpc` target (speech_stats.STATS_RPC_METHOD): the engine's speech counters for /metrics."""
        return stats_call(self.model_runner)


def serve_on_one_intra_op_thread() -> None:
    """The worker serves many small host steps on one thread. torch would fan a large CPU op out to a thread per
    core, and those threads spin between steps beside the engine's own (session 9 on the H200, lanes mode: 15 of
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
