"""The hooks `vllm_hooks` checks match the installed vLLM, and a changed or missing one stops start-up with one
message."""

import os
import subprocess
import sys
import textwrap

import pytest

from vllm_voxserve import vllm_hooks


def test_every_hook_but_the_capture_stream_matches_the_installed_vllm():
    # on GPU, the capture-stream hooks are needed only by the lanes settings that use them (serving_uses)
    assert vllm_hooks.hook_problems([vllm_hooks.REGISTRATION, vllm_hooks.SERVING, vllm_hooks.CPU, vllm_hooks.GPU]) == []


def _stopped(uses) -> str:
    with pytest.raises(vllm_hooks.UnsupportedVllm) as stop:
        vllm_hooks.check_hooks(uses)
    message = str(stop.value)
    assert "\n" not in message and vllm_hooks.TESTED_RANGE in message
    return message


def test_a_hook_with_other_parameters_stops_naming_it_and_both_signatures(monkeypatch):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    monkeypatch.setattr(CPUModelRunner, "_preprocess", lambda self, scheduler_output, num_tokens: None)
    message = _stopped(vllm_hooks.serving_uses(True, None))
    assert ("vllm.v1.worker.cpu_model_runner:CPUModelRunner._preprocess: takes (scheduler_output, num_tokens), "
            "the plugin needs (scheduler_output, num_input_tokens, intermediate_tensors)") in message
    assert message.count("vllm.v1") == 1  # the other hooks still match


def test_a_missing_hook_stops_naming_it(monkeypatch):
    from vllm.v1.engine.core import EngineCore

    monkeypatch.delattr(EngineCore, "collective_rpc")
    assert "vllm.v1.engine.core:EngineCore.collective_rpc: missing" in _stopped([vllm_hooks.SERVING])


def test_a_newly_required_parameter_stops_what_the_plugin_calls(monkeypatch):
    from vllm.v1.core.sched.request_queue import RequestQueue

    monkeypatch.setattr(RequestQueue, "remove_requests", lambda self, requests, reason: None)
    assert "it also requires reason" in _stopped([vllm_hooks.SERVING])


def test_the_gpu_lanes_settings_decide_whether_the_capture_stream_hooks_are_needed():
    lanes = type("Lanes", (), {"backbone_priority": "least"})
    assert vllm_hooks.CAPTURE_STREAM not in vllm_hooks.serving_uses(False, lanes)
    lanes.backbone_priority = "high"
    assert vllm_hooks.CAPTURE_STREAM in vllm_hooks.serving_uses(False, lanes)
    assert vllm_hooks.serving_uses(True, lanes) == (vllm_hooks.SERVING, vllm_hooks.CPU)


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
