"""Every patch of vLLM internals, in one place. Each names its target, the vLLM version it was read from, and why.

Pinned: vLLM 0.26.0. `tests/test_compat.py` checks that the targets still exist.
"""

from __future__ import annotations

import contextlib
import os
import sys
from importlib.metadata import entry_points

PLUGIN_NAME = "voxserve"


def add_plugin_cli_flag() -> None:
    """Target: `vllm.engine.arg_utils.EngineArgs.add_cli_args` (staticmethod, 0.26.0 arg_utils.py).

    Why: users write `vllm serve MODEL --plugin voxserve`; vLLM has no such flag, so argparse would reject it.
    vLLM loads general plugins (us) while building the serve parser, just before `EngineArgs.add_cli_args`, so
    wrapping it adds the flag in time. The value itself is read from sys.argv (see `plugin_requested_on_command_line`);
    the parsed attribute is ignored by vLLM because `EngineArgs.from_cli_args` copies dataclass fields only.
    """
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.add_cli_args
    if getattr(original, "_voxserve_wrapped", False):
        return

    def add_cli_args(parser):
        parser = original(parser)
        if not any("--plugin" in action.option_strings for action in parser._actions):
            parser.add_argument(
                "--plugin",
                action="append",
                default=None,
                help="Enable a vLLM plugin by name (voxserve: streaming speech synthesis at /v1/audio/speech).",
            )
        return parser

    add_cli_args._voxserve_wrapped = True
    EngineArgs.add_cli_args = staticmethod(add_cli_args)


def plugin_requested_on_command_line(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv) and PLUGIN_NAME in argv[i + 1].split(","):
            return True
        if arg.startswith("--plugin=") and PLUGIN_NAME in arg.split("=", 1)[1].split(","):
            return True
    return False


def allow_endpoint_plugin() -> None:
    """Target: the `VLLM_PLUGINS` allow-list (0.26.0 envs.py, plugins/__init__.py).

    Why: with VLLM_PLUGINS unset vLLM loads every general plugin but never an endpoint plugin, so `--plugin voxserve`
    alone would register the model without its /v1/audio/speech route. Naming every installed general plugin plus
    ours keeps what loads in every process unchanged and adds our endpoint. The API server reads the variable
    uncached, and the engine and worker processes inherit it.
    """
    names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    names.add(PLUGIN_NAME)
    os.environ["VLLM_PLUGINS"] = ",".join(sorted(names))


@contextlib.contextmanager
def capture_vllm_graphs_on(stream):
    """Targets (vLLM 0.26.0, torch 2.11): `vllm.v1.worker.gpu.cudagraph_utils.graph_capture` (the module's imported
    name, used by `CudaGraphManager.capture`, cudagraph_utils.py:309) and `torch.cuda.graph.default_capture_stream`
    (class attribute, torch/cuda/graphs.py).

    Why: Model Runner V2 captures its PIECEWISE graphs on the stream `graph_capture` makes current and its FULL graphs
    on torch's default capture stream (`torch.cuda.graph(graph, pool)` names none). A CUDA graph's SMs are fixed by
    the context of the stream it was captured on, so putting the backbone's decode graphs on the LM partition means
    capturing both kinds on that partition's green-context stream; vLLM replays them on its own (primary-context)
    stream, which only orders them. Both names are restored on exit, so only vLLM's capture sees the stream.
    """
    import torch
    from vllm.distributed.parallel_state import GraphCaptureContext, graph_capture
    from vllm.v1.worker.gpu import cudagraph_utils

    def graph_capture_on_stream(device, graph_capture_context=None):
        return graph_capture(device, graph_capture_context or GraphCaptureContext(stream))

    saved_capture, saved_default = cudagraph_utils.graph_capture, torch.cuda.graph.default_capture_stream
    cudagraph_utils.graph_capture = graph_capture_on_stream
    torch.cuda.graph.default_capture_stream = stream
    try:
        yield
    finally:
        cudagraph_utils.graph_capture = saved_capture
        torch.cuda.graph.default_capture_stream = saved_default


def route_mode_rpc_through_scheduler(method_name: str, handler) -> None:
    """Target: `vllm.v1.engine.core.EngineCore.collective_rpc` (0.26.0 v1/engine/core.py:945), in the engine-core
    process (our scheduler installs it when vLLM builds it there).

    Why: `POST /voxserve/mode` reaches the workers through vLLM's `collective_rpc`, but the `vllm-stock` serving mode
    and the admission modes (`lanes+prefill_first`) also change the scheduler, which lives in the engine core and
    has no RPC of its own. For our method only, the call goes to `handler(scheduler, mode, forward)`
    (`scheduler.serving_mode.handle_mode_call`), which forwards the codec part to the workers through the original
    method; every other call is untouched.
    """
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.collective_rpc
    if getattr(original, "_voxserve_wrapped", False):
        return

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        scheduler = getattr(self, "scheduler", None)
        if method != method_name or not hasattr(scheduler, "set_policy"):
            return original(self, method, timeout, args, kwargs)
        mode = args[0] if args else None
        return handler(scheduler, mode, lambda codec_mode: original(self, method, timeout, (codec_mode,), kwargs))

    collective_rpc._voxserve_wrapped = True
    EngineCore.collective_rpc = collective_rpc


# Target: the `ModelRunnerOutput` a worker step returns (0.26.0 v1/outputs.py), which vLLM passes unchanged to
# `Scheduler.update_from_output` in the engine core (in process, or pickled from a worker process).
# Why: the speech scheduler needs each step's progress, costs and failures from the worker, and 0.26 has no field
# for a model's own per-step data (`kv_connector_output` and the rest belong to vLLM's features). An extra attribute
# rides along; a scheduler that does not know it never reads it.
STEP_REPORT_ATTR = "voxserve_report"


def attach_step_report(output, make_report) -> None:
    """Worker side: put `make_report()` (a `contract.StepReport`) on the ModelRunnerOutput a step's `sample_tokens`
    returned, or on the one its async output will return (Model Runner V2's `AsyncOutput.model_runner_output`, V1's
    `AsyncGPUModelRunnerOutput._model_runner_output`: `get_output()` hands back that very object)."""
    target = getattr(output, "model_runner_output", None) or getattr(output, "_model_runner_output", None) or output
    if getattr(target, "req_ids", None):  # a real step; never the shared empty output
        setattr(target, STEP_REPORT_ATTR, make_report())


def step_report_of(model_runner_output):
    """Engine-core side: the worker's `contract.StepReport` on a step's output, or None (Model Runner V2 without
    reports, vLLM's warm-up steps)."""
    return getattr(model_runner_output, STEP_REPORT_ATTR, None)
