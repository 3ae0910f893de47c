"""The private vLLM hooks the plugin relies on, checked by name and signature.

Tested range: vLLM 0.26.0 (CPU and GPU) to 0.32.0 (CPU), `setup.py`'s `vllm>=0.26,<0.33`. `HOOKS` names each hook
with the parameters the plugin passes or overrides; `check_hooks` verifies them when the plugin registers (the hooks
registration needs) and when vLLM builds the config of a speech model (the hooks serving needs on that platform), so a
vLLM outside the range stops start-up with one message instead of failing inside a step. The checks ask whether vLLM
offers a hook in the form the plugin uses, never which version it is; the patches that use the hooks are in
`compat`.

Where the newest tested version (0.32) stands on other footing than 0.26:
- Logging: vLLM configures its `vllm` logger from a `LoggingConfig` after plugins load, not on import, and builds
  new handlers each time (`compat.log_through_vllm` forwards to whatever handlers it has when a line is logged).
- Scheduler: `Scheduler.__init__` reads more model facts (`uses_mrope`, `supports_multimodal_inputs`) and
  a pooling runner samples no token; the subclassing hooks (`schedule`, `update_from_output`, `add_request`) and
  `scheduler_cls` are unchanged.
- CUDA graph capture (Model Runner V2): `graph_capture(device)` makes its own stream and takes no context, and FULL
  graphs are captured on the current stream, not torch's default capture stream:
  `compat.capture_vllm_graphs_on` has no footing there, so `lanes.backbone_priority` other than "least" needs
  0.26's hooks.
- Batch-invariant execution moved to `vllm.model_executor.determinism` (configs per op); the plugin does not use it
  on any version: a seeded request's codes come from its own counter noise (models/seeded_noise.py).
- The endpoint-plugin interface (`vllm.plugins.endpoint_plugins.interface.EndpointPlugin`: `attach_router`,
  `init_state`) and the model's `get_model_state_cls` hook are public in both and unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterable

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
            ("vllm.v1.outputs:ModelRunnerOutput", None),  # carries the step report (compat.attach_step_report)
            ("vllm.v1.engine.core:EngineCore.collective_rpc", ("method", "timeout", "args", "kwargs")),
            ("vllm.v1.engine.core:EngineCore.add_request", ("request", "request_wave"))),
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
            ("vllm.v1.worker.gpu_worker:Worker.determine_available_memory", ()),
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
    # compat.capture_vllm_graphs_on
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
