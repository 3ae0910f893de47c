"""Every patch of vLLM internals, and every private hook the plugin relies on, in one place.

Tested range: vLLM 0.26.0 (CPU and GPU) to 0.32.0 (CPU), `setup.py`'s `vllm>=0.26,<0.33`. `HOOKS` names each hook
with the parameters the plugin passes or overrides; `check_hooks` verifies them by name and signature when the
plugin registers (the hooks registration needs) and when vLLM builds the config of a speech model (the hooks serving
needs on that platform), so a vLLM outside the range stops start-up with one message instead of failing inside a
step. Choices between versions are made by feature detection, never by version strings.

Where the newest tested version (0.32) stands on other footing than 0.26:
- Logging: vLLM configures its `vllm` logger from a `LoggingConfig` after plugins load, not on import, and builds
  new handlers each time (`log_through_vllm` forwards to whatever handlers it has when a line is logged).
- Scheduler: `Scheduler.__init__` reads more model facts (`uses_mrope`, `supports_multimodal_inputs`) and
  a pooling runner samples no token; the subclassing hooks (`schedule`, `update_from_output`, `add_request`) and
  `scheduler_cls` are unchanged.
- CUDA graph capture (Model Runner V2): `graph_capture(device)` makes its own stream and takes no context, and FULL
  graphs are captured on the current stream, not torch's default capture stream: `capture_vllm_graphs_on` has no
  footing there, so `lanes.backbone_priority` other than "least" needs 0.26's hooks.
- Batch-invariant execution moved to `vllm.model_executor.determinism` (configs per op); the plugin does not use it
  on any version: a seeded request's codes come from its own counter noise (models/seeded_noise.py).
- The endpoint-plugin interface (`vllm.plugins.endpoint_plugins.interface.EndpointPlugin`: `attach_router`,
  `init_state`) and the model's `get_model_state_cls` hook are public in both and unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points

PLUGIN_NAME = "voxserve"


def add_plugin_cli_flag() -> None:
    """Target: `vllm.engine.arg_utils.EngineArgs.add_cli_args` (staticmethod, arg_utils.py, 0.26.0 to 0.32.0).

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


_SCHEDULER_RPC_ROUTES: dict = {}  # method name -> handler(scheduler, args, forward)


def route_rpc_through_scheduler(method_name: str, handler) -> None:
    """Target: `vllm.v1.engine.core.EngineCore.collective_rpc` (0.26.0 v1/engine/core.py:945), in the engine-core
    process (our scheduler installs it when vLLM builds it there).

    Why: two of our calls from the API server also concern the scheduler, which lives in the engine core and has no
    RPC of its own. `POST /voxserve/mode`: the `vllm-stock` serving mode and the admission modes change the scheduler
    (`scheduler.serving_mode.handle_mode_call`). A text stream's text (`contract.TEXT_RPC_METHOD`): the scheduler
    runs a text stream only while the text its next frame reads has arrived. For our methods only, the call goes to
    `handler(scheduler, args, forward)`, where `forward(args)` runs the original method (the workers' replies);
    every other call is untouched.
    """
    from vllm.v1.engine.core import EngineCore

    _SCHEDULER_RPC_ROUTES[method_name] = handler
    original = EngineCore.collective_rpc
    if getattr(original, "_voxserve_wrapped", False):
        return

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        scheduler = getattr(self, "scheduler", None)
        route = _SCHEDULER_RPC_ROUTES.get(method)
        if route is None or not hasattr(scheduler, "set_policy"):
            return original(self, method, timeout, args, kwargs)
        return route(scheduler, tuple(args), lambda forwarded: original(self, method, timeout, forwarded, kwargs))

    collective_rpc._voxserve_wrapped = True
    EngineCore.collective_rpc = collective_rpc


def route_mode_rpc_through_scheduler(method_name: str, handler) -> None:
    """`route_rpc_through_scheduler` for the mode call: `handler(scheduler, mode, forward(codec_mode))`."""

    def route(scheduler, args, forward):
        return handler(scheduler, args[0] if args else None, lambda codec_mode: forward((codec_mode,)))

    route_rpc_through_scheduler(method_name, route)


def data_parallel_ranks(engine_client) -> int:
    """Targets: `AsyncLLM.generate(data_parallel_rank=)` and the API server's `ParallelConfig` (0.26.0 to 0.32.0).

    Why: the endpoint steers each request to a rank and retries a refused one on another (`entrypoints.rank_choice`).
    It reaches all `data_parallel_size` ranks under vLLM's internal load balancing only; with external or hybrid
    balancing, or without the parameter, it returns 1: vLLM routes and nothing is retried.
    """
    parallel = getattr(getattr(engine_client, "vllm_config", None), "parallel_config", None)
    size = getattr(parallel, "data_parallel_size", 1) or 1
    if size < 2 or getattr(parallel, "data_parallel_external_lb", False) or getattr(
            parallel, "data_parallel_hybrid_lb", False):
        return 1
    try:
        steerable = "data_parallel_rank" in inspect.signature(engine_client.generate).parameters
    except (AttributeError, TypeError, ValueError):
        steerable = False
    return size if steerable else 1


async def collective_rpc_per_rank(engine_client, method: str, args: tuple = ()) -> list[list]:
    """Every data-parallel rank's `collective_rpc` replies: one list per rank, one reply per worker.

    Target: `DPLBAsyncMPClient` (v1/engine/core_client.py, 0.26.0 to 0.32.0): its `collective_rpc` runs on every
    engine but returns the first engine's replies; `core_engines` and `_call_utility_async(..., engine=)` reach one.
    Why: a mode switch must report the rank that refused it (409 while it serves) and /metrics must count every
    rank's codec work. Without those attributes `collective_rpc`'s own answer stands for the only rank.
    """
    import asyncio

    core = getattr(engine_client, "engine_core", None)
    engines, call_one = getattr(core, "core_engines", None), getattr(core, "_call_utility_async", None)
    if data_parallel_ranks(engine_client) < 2 or not engines or len(engines) < 2 or call_one is None:
        return [await engine_client.collective_rpc(method, args=args)]
    return list(await asyncio.gather(*(call_one("collective_rpc", method, None, args, None, engine=engine)
                                       for engine in engines)))


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


def log_through_vllm() -> None:
    """Target: the `vllm` logger's handlers (vllm/logger.py).

    Why: our modules log under `vllm_voxserve`, which vLLM's logging set-up does not cover (it configures the `vllm`
    logger only): without this, INFO lines such as the granted SM counts or the step host times go nowhere. Some
    versions configure that logger on import, others after plugins load and anew per `LoggingConfig`, so our records
    go to the handlers it has when each line is logged, at the level it has or, not yet configured, will have.
    """
    import vllm.envs as envs
    import vllm.logger  # noqa: F401  (configures vLLM's logger on import where that version does)

    ours, theirs = logging.getLogger("vllm_voxserve"), logging.getLogger("vllm")
    if any(isinstance(h, _ToVllmHandlers) for h in ours.handlers):
        return
    ours.addHandler(_ToVllmHandlers())
    ours.setLevel(theirs.level or logging.getLevelName(envs.VLLM_LOGGING_LEVEL))
    ours.propagate = False


class _ToVllmHandlers(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("vllm").handle(record)


# --- the hooks, checked by name and signature ---------------------------------------------------------------------

TESTED_RANGE = "vLLM 0.26.0 to 0.32.0 (vllm>=0.26,<0.33; GPU on 0.26.0)"

REGISTRATION = "registration"  # what `plugin.register()` touches, in every vLLM process
SERVING = "serving"  # what serving a speech model touches on any platform
CPU = "cpu"  # vLLM's CPU worker and its V1 model runner
GPU = "gpu"  # vLLM's GPU worker, its V1 runner and Model Runner V2
CAPTURE_STREAM = "capture-stream"  # GPU with lanes.backbone_priority other than "least"

# How a hook's parameters (after self) must read: "exact" for methods we override or replace (vLLM calls ours with
# its arguments), "leading" for what we call positionally (later parameters need defaults), "keywords" for what we
# call by keyword (`params` among its parameters, the rest with defaults), "includes" for what we only read from
# the arguments vLLM passes through us (`params` among its parameters).
EXACT, LEADING, KEYWORDS, INCLUDES = "exact", "leading", "keywords", "includes"


@dataclasses.dataclass(frozen=True)
class Hook:
    target: str  # "module:Attribute.path"
    use: str  # one of the groups above
    params: tuple[str, ...] | None = None  # None: only that it exists
    match: str = EXACT


def _hooks(use: str, match: str, *specs: tuple[str, tuple[str, ...] | None]) -> tuple[Hook, ...]:
    return tuple(Hook(target, use, params, match) for target, params in specs)


_V1_RUNNER_HOOKS = (("load_model", None), ("_update_states", ("scheduler_output",)),
                    ("_preprocess", ("scheduler_output", "num_input_tokens", "intermediate_tensors")),
                    ("_model_forward", None), ("sample_tokens", ("grammar_output",)))

HOOKS: tuple[Hook, ...] = (
    *_hooks(REGISTRATION, EXACT,
            ("vllm.engine.arg_utils:EngineArgs.add_cli_args", ("parser",)),
            ("vllm.transformers_utils.config:_CONFIG_REGISTRY", None),
            ("vllm.model_executor.models.config:MODELS_CONFIG_MAP", None),
            ("vllm.model_executor.models.config:VerifyAndUpdateConfig.verify_and_update_config", ("vllm_config",)),
            ("vllm.plugins:load_endpoint_plugins", None),
            ("vllm.plugins.endpoint_plugins.interface:EndpointPlugin.attach_router", ("app",)),
            ("vllm.plugins.endpoint_plugins.interface:EndpointPlugin.init_state", ("engine_client", "state", "args"))),
    # the scheduler (scheduler/adapter.py) and the mode RPC routed through it
    *_hooks(SERVING, EXACT,
            ("vllm.v1.core.sched.scheduler:Scheduler.add_request", ("request",)),
            ("vllm.v1.core.sched.scheduler:Scheduler.update_from_output", ("scheduler_output", "model_runner_output")),
            ("vllm.v1.core.sched.scheduler:Scheduler.schedule", None),
            # false while every request waits for text (scheduler/text_adapter.py): the engine core then waits
            ("vllm.v1.core.sched.scheduler:Scheduler.has_requests", ()),
            ("vllm.v1.core.sched.async_scheduler:AsyncScheduler", None),
            ("vllm.v1.outputs:ModelRunnerOutput", None),  # carries the step report (attach_step_report)
            ("vllm.v1.engine.core:EngineCore.collective_rpc", ("method", "timeout", "args", "kwargs"))),
    *_hooks(SERVING, LEADING,
            ("vllm.v1.core.sched.scheduler:Scheduler.finish_requests", ("request_ids", "finished_status")),
            ("vllm.v1.core.sched.scheduler:Scheduler.get_num_unfinished_requests", ()),
            ("vllm.v1.core.sched.request_queue:RequestQueue.add_request", ("request",)),
            ("vllm.v1.core.sched.request_queue:RequestQueue.remove_requests", ("requests",)),
            ("vllm.v1.request:Request.get_finished_reason", ()),
            ("vllm.v1.engine.async_llm:AsyncLLM.generate", ("prompt", "sampling_params", "request_id")),
            # the model (models/qwen3_tts/vllm_model.py)
            ("vllm.model_executor.models.qwen3:Qwen3DecoderLayer.__init__",
             ("config", "cache_config", "quant_config", "prefix")),
            ("vllm.model_executor.layers.layernorm:RMSNorm.__init__", ("hidden_size", "eps")),
            ("vllm.model_executor.model_loader.weight_utils:default_weight_loader", ("param", "loaded_weight"))),
    *_hooks(SERVING, INCLUDES, ("vllm.v1.core.sched.scheduler:Scheduler.__init__", ("vllm_config",))),
    *_hooks(SERVING, KEYWORDS,
            ("vllm.v1.engine:EngineCoreOutput", ("request_id", "new_token_ids", "finish_reason", "stop_reason")),
            ("vllm.v1.engine:EngineCoreOutputs", ("outputs",)),
            ("vllm.v1.engine.async_llm:AsyncLLM.collective_rpc", ("method", "args")),
            ("vllm.compilation.decorators:support_torch_compile", ("dynamic_arg_dims",))),
    *_hooks(CPU, EXACT, ("vllm.v1.worker.cpu_worker:CPUWorker.init_device", ()),
            *((f"vllm.v1.worker.cpu_model_runner:CPUModelRunner.{name}", p) for name, p in _V1_RUNNER_HOOKS)),
    *_hooks(CPU, LEADING, ("vllm.v1.worker.cpu_model_runner:CPUModelRunner.__init__", ("vllm_config", "device"))),
    *_hooks(GPU, EXACT,
            ("vllm.v1.worker.gpu_worker:Worker.init_device", ()),
            ("vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model", ()),
            ("vllm.v1.worker.gpu_worker:Worker.execute_model", ("scheduler_output",)),
            ("vllm.v1.worker.gpu_worker:Worker.sample_tokens", ("grammar_output",)),
            *((f"vllm.v1.worker.gpu_model_runner:GPUModelRunner.{name}", p) for name, p in _V1_RUNNER_HOOKS),
            # Model Runner V2's per-model state (worker/mrv2_state.py), found through the model's get_model_state_cls
            ("vllm.v1.worker.gpu.model_states:init_model_state", None),
            ("vllm.v1.worker.gpu.model_states.default:DefaultModelState.__init__",
             ("vllm_config", "model", "encoder_cache", "device")),
            ("vllm.v1.worker.gpu.model_states.default:DefaultModelState.add_request", ("req_index", "new_req_data")),
            ("vllm.v1.worker.gpu.model_states.default:DefaultModelState.remove_request", ("req_id",)),
            ("vllm.v1.worker.gpu.model_states.default:DefaultModelState.prepare_inputs", ("input_batch", "req_states")),
            ("vllm.v1.worker.gpu.model_states.default:DefaultModelState.postprocess_state",
             ("idx_mapping", "num_sampled", "num_computed_tokens"))),
    *_hooks(GPU, LEADING, ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__", ("vllm_config", "device"))),
    # capture_vllm_graphs_on
    *_hooks(CAPTURE_STREAM, LEADING,
            ("vllm.v1.worker.gpu.cudagraph_utils:graph_capture", ("device", "graph_capture_context")),
            ("vllm.distributed.parallel_state:graph_capture", ("device", "graph_capture_context")),
            ("vllm.distributed.parallel_state:GraphCaptureContext", ("stream",)),
            ("vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model", None),
            ("torch.cuda:graph.default_capture_stream", None)),
)

_HINTS = {CAPTURE_STREAM: 'voxserve.lanes.backbone_priority "least"'}


class UnsupportedVllm(SystemExit):
    """A hook the plugin needs is missing or changed in the installed vLLM. A SystemExit, so that start-up stops
    with this message alone: vLLM calls plugins and config hooks without catching it, and the interpreter prints it
    without a traceback."""


def serving_uses(is_cpu: bool, lanes) -> tuple[str, ...]:
    """The hook groups serving needs on this platform with this `VoxServeConfig.lanes`."""
    if is_cpu:
        return SERVING, CPU
    if lanes.backbone_priority != "least":
        return SERVING, GPU, CAPTURE_STREAM
    return SERVING, GPU


def hook_problems(uses: Iterable[str]) -> list[str]:
    """One line per hook of these groups that the installed vLLM lacks or has with other parameters."""
    uses = set(uses)
    return [f"{hook.target}: {problem}" for hook in HOOKS if hook.use in uses and (problem := _problem(hook))]


def check_hooks(uses: Iterable[str]) -> None:
    """Stop (UnsupportedVllm) naming every hook of these groups that does not match, and the tested range."""
    uses = tuple(uses)
    problems = hook_problems(uses)
    if problems:
        hints = "".join(f" To serve without them: {_HINTS[use]}." for use in uses
                        if use in _HINTS and hook_problems([use]))
        raise UnsupportedVllm(f"vllm-voxserve cannot run on the installed vLLM {_vllm_version()}: "
                              + "; ".join(problems) + f". Tested range: {TESTED_RANGE}.{hints}")


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "(version unknown)"


def _problem(hook: Hook) -> str | None:
    module_name, _, path = hook.target.partition(":")
    try:
        target = importlib.import_module(module_name)
        for name in path.split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError) as exc:
        return f"missing ({type(exc).__name__}: {exc})"
    if hook.params is None:
        return None
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return "has no readable signature"
    if parameters and parameters[0].name in ("self", "cls") and "." in path:
        parameters = parameters[1:]
    return _parameter_problem(hook, parameters)


def _parameter_problem(hook: Hook, parameters: list[inspect.Parameter]) -> str | None:
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = [p for p in parameters if p.kind not in variadic]
    names = [p.name for p in named]
    wanted = list(hook.params)
    found = f"takes ({', '.join(_describe(p) for p in parameters)}), the plugin needs ({', '.join(wanted)})"
    if hook.match == EXACT:
        return None if names == wanted else found
    if hook.match == LEADING:
        positional = [p.name for p in named if p.kind != inspect.Parameter.KEYWORD_ONLY]
        if positional[: len(wanted)] != wanted:
            return found
        rest = named[len(wanted):]
    else:
        if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters):
            return None
        if not set(wanted) <= set(names):
            return found
        if hook.match == INCLUDES:
            return None
        rest = [p for p in named if p.name not in wanted]
    required = [p.name for p in rest if p.default is inspect.Parameter.empty]
    return f"{found}; it also requires {', '.join(required)}" if required else None


def _describe(parameter: inspect.Parameter) -> str:
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
    default = "=…" if parameter.default is not inspect.Parameter.empty else ""
    return f"{prefix}{parameter.name}{default}"
