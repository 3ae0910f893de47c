"""The hooks `compat` checks match the installed vLLM, a changed or missing one stops start-up with one message, and
the capture-stream patch is scoped."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from vllm_voxserve import compat

capture_stream_hooks = pytest.mark.skipif(bool(compat.hook_problems([compat.CAPTURE_STREAM])),
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


def test_every_hook_but_the_capture_stream_matches_the_installed_vllm():
    # on GPU, the capture-stream hooks are needed only by the lanes settings that use them (serving_uses)
    assert compat.hook_problems([compat.REGISTRATION, compat.SERVING, compat.CPU, compat.GPU]) == []


def _stopped(uses) -> str:
    with pytest.raises(compat.UnsupportedVllm) as stop:
        compat.check_hooks(uses)
    message = str(stop.value)
    assert "\n" not in message and compat.TESTED_RANGE in message
    return message


def test_a_hook_with_other_parameters_stops_naming_it_and_both_signatures(monkeypatch):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    monkeypatch.setattr(CPUModelRunner, "_preprocess", lambda self, scheduler_output, num_tokens: None)
    message = _stopped(compat.serving_uses(True, None))
    assert ("vllm.v1.worker.cpu_model_runner:CPUModelRunner._preprocess: takes (scheduler_output, num_tokens), "
            "the plugin needs (scheduler_output, num_input_tokens, intermediate_tensors)") in message
    assert message.count("vllm.v1") == 1  # the other hooks still match


def test_a_missing_hook_stops_naming_it(monkeypatch):
    from vllm.v1.engine.core import EngineCore

    monkeypatch.delattr(EngineCore, "collective_rpc")
    assert "vllm.v1.engine.core:EngineCore.collective_rpc: missing" in _stopped([compat.SERVING])


def test_a_newly_required_parameter_stops_what_the_plugin_calls(monkeypatch):
    from vllm.v1.core.sched.request_queue import RequestQueue

    monkeypatch.setattr(RequestQueue, "remove_requests", lambda self, requests, reason: None)
    assert "it also requires reason" in _stopped([compat.SERVING])


def test_the_gpu_lanes_settings_decide_whether_the_capture_stream_hooks_are_needed():
    lanes = type("Lanes", (), {"backbone_priority": "least"})
    assert compat.CAPTURE_STREAM not in compat.serving_uses(False, lanes)
    lanes.backbone_priority = "high"
    assert compat.CAPTURE_STREAM in compat.serving_uses(False, lanes)
    assert compat.serving_uses(True, lanes) == (compat.SERVING, compat.CPU)


def test_a_process_whose_vllm_lacks_a_hook_exits_with_the_message_alone():
    code = textwrap.dedent("""
        from vllm.engine.arg_utils import EngineArgs
        del EngineArgs.add_cli_args
        from vllm_voxserve import plugin
        plugin.register()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("vllm-voxserve cannot run on the installed vLLM")
    assert "vllm.engine.arg_utils:EngineArgs.add_cli_args: missing" in done.stderr


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
