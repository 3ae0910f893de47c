"""The patches of vLLM internals: the capture-stream patch is scoped, the mode RPC reaches our scheduler and nothing
else does, and a step report rides on vLLM's step output."""

import pytest
import torch

from vllm_voxserve import vllm_hooks, compat

capture_stream_hooks = pytest.mark.skipif(bool(vllm_hooks.hook_problems([vllm_hooks.CAPTURE_STREAM])),
                                          reason="this vLLM has no footing for the capture-stream patch")


@capture_stream_hooks
def test_capture_stream_patch_is_applied_inside_and_restored_after():
    from vllm.v1.worker.gpu import cudagraph_utils

    before_capture, before_default = cudagraph_utils.graph_capture, torch.cuda.graph.default_capture_stream
    marker = object()  # stands in for a green-context stream (no CUDA here)
    with compat.capture_vllm_graphs_on(marker):
        assert cudagraph_utils.graph_capture is not before_capture
        assert torch.cuda.graph.default_capture_stream is marker
    assert cudagraph_utils.graph_capture is before_capture
    assert torch.cuda.graph.default_capture_stream is before_default


@capture_stream_hooks
def test_patched_graph_capture_passes_the_stream_to_vllm(monkeypatch):
    import vllm.distributed.parallel_state as parallel_state
    from vllm.v1.worker.gpu import cudagraph_utils

    seen = []
    monkeypatch.setattr(parallel_state, "graph_capture", lambda device, context=None: seen.append(context))
    marker = object()
    with compat.capture_vllm_graphs_on(marker):
        cudagraph_utils.graph_capture("cuda:0")
    assert seen[0].stream is marker


def test_mode_rpc_goes_through_our_scheduler_and_nothing_else_does():
    import types

    from vllm.v1.engine.core import EngineCore

    from vllm_voxserve.scheduler.serving_mode import STOCK_MODE, handle_mode_call

    compat.route_mode_rpc_through_scheduler("voxserve_codec_mode", handle_mode_call)
    compat.route_mode_rpc_through_scheduler("voxserve_codec_mode", handle_mode_call)  # idempotent
    sent = []

    def executor_rpc(method, timeout, args, kwargs):
        sent.append((method, args))
        return [{"status": 200, "modes": ["inline", "lanes"], "current": args[0] or "inline"}]

    class Scheduler:
        stock = False
        admission_mode = configured_admission_mode = "deadline_aware"

        def has_requests(self):
            return False

        def set_policy(self, stock, admission_mode):
            self.stock, self.admission_mode = stock, admission_mode

    core = types.SimpleNamespace(scheduler=Scheduler(),
                                 model_executor=types.SimpleNamespace(collective_rpc=executor_rpc))
    replies = EngineCore.collective_rpc(core, "voxserve_codec_mode", None, (STOCK_MODE,))
    assert sent == [("voxserve_codec_mode", ("inline",))] and core.scheduler.stock
    assert replies[0]["current"] == STOCK_MODE
    assert EngineCore.collective_rpc(core, "other_method", None, (1,)) == [
        {"status": 200, "modes": ["inline", "lanes"], "current": 1}]
    assert sent[-1] == ("other_method", (1,))
    core.scheduler = object()  # a scheduler without the serving modes (a user's --scheduler-cls): untouched
    EngineCore.collective_rpc(core, "voxserve_codec_mode", None, (STOCK_MODE,))
    assert sent[-1] == ("voxserve_codec_mode", (STOCK_MODE,))


def test_a_step_report_rides_on_vllms_model_runner_output():
    """`ModelRunnerOutput` must take an extra attribute (a slotted dataclass would refuse it) and keep it through
    pickling (the worker and the engine core may be different processes)."""
    import pickle

    from vllm.v1.outputs import ModelRunnerOutput

    from vllm_voxserve.contract import StepReport

    output = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})
    assert compat.step_report_of(output) is None
    compat.attach_step_report(output, lambda: StepReport(1.0, failed={"r": "boom"}))
    assert compat.step_report_of(pickle.loads(pickle.dumps(output))) == StepReport(1.0, failed={"r": "boom"})
