"""The patches of vLLM internals, and the private vLLM attributes the plugin reads: each names its target and why.

`vllm_hooks` lists the hooks these patches rely on and checks them by name and signature at start-up; what it does
not list is read here with a fallback to vLLM's own behaviour. Where vLLM versions differ, a patch detects the feature
it needs, never a version string.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
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


def answer_refusals_at_arrival() -> None:
    """Target: `vllm.v1.engine.core.EngineCore.add_request` (0.26.0 v1/engine/core.py:431), in the engine-core process
    (our scheduler installs it when vLLM builds it there).

    Why: our scheduler refuses an arrival it cannot serve in time inside `add_request` and finishes it there, but vLLM
    sends a finished request's output only with the next engine step's outputs, one or two steps later: on the H200
    the engine's refusals were answered p50 43-92 ms, p99 96-137 ms after they were sent at 88-208 req/s, the API
    server's own p99 6-21 ms (2026-12-04_4af55f2, start 3), where a refusal is to come within 50 ms. After the
    original method, the refusals the scheduler has not answered yet (`take_refusals`) go on the engine core's output
    queue at once, as vLLM itself answers the requests it turns away while shutting down. An engine core without an
    output queue (in-process) leaves them to the next step's outputs."""
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.add_request
    if getattr(original, "_voxserve_wrapped", False):
        return

    def add_request(self, request, request_wave=0):
        original(self, request, request_wave)
        take = getattr(self.scheduler, "take_refusals", None)
        queue = getattr(self, "output_queue", None)
        if take is None or queue is None:
            return
        for client_index, outputs in take().items():
            queue.put_nowait((client_index, outputs))

    add_request._voxserve_wrapped = True
    EngineCore.add_request = add_request


def route_mode_rpc_through_scheduler(method_name: str, handler) -> None:
    """`route_rpc_through_scheduler` for the mode call: `handler(scheduler, mode, forward(codec_mode))`."""

    def route(scheduler, args, forward):
        return handler(scheduler, args[0] if args else None, lambda codec_mode: forward((codec_mode,)))

    route_rpc_through_scheduler(method_name, route)


def _data_parallel(engine_client) -> tuple:
    """The API server's `ParallelConfig` (None where the client has none) and its data-parallel size."""
    parallel = getattr(getattr(engine_client, "vllm_config", None), "parallel_config", None)
    return parallel, getattr(parallel, "data_parallel_size", 1) or 1


def _balanced_outside(parallel) -> bool:
    """Whether vLLM's external or hybrid load balancing, not this API server, picks the engine of a request."""
    return bool(getattr(parallel, "data_parallel_external_lb", False)
                or getattr(parallel, "data_parallel_hybrid_lb", False))


def data_parallel_ranks(engine_client) -> int:
    """Targets: `AsyncLLM.generate(data_parallel_rank=)` and the API server's `ParallelConfig` (0.26.0 to 0.32.0).

    Why: the endpoint steers each request to a rank and retries a refused one on another (`entrypoints.rank_choice`).
    It reaches all `data_parallel_size` ranks under vLLM's internal load balancing only; with external or hybrid
    balancing, or without the parameter, it returns 1: vLLM routes and nothing is retried.
    """
    parallel, size = _data_parallel(engine_client)
    if size < 2 or _balanced_outside(parallel):
        return 1
    try:
        steerable = "data_parallel_rank" in inspect.signature(engine_client.generate).parameters
    except (AttributeError, TypeError, ValueError):
        steerable = False
    return size if steerable else 1


def steers_every_engine(engine_client) -> bool:
    """Targets: the API server's `ParallelConfig` (0.26.0 to 0.32.0), as `data_parallel_ranks`.

    Why: an API server refuses arrivals itself after an engine's refusal for its requests in progress only where it
    knows that engine takes its next request (`entrypoints.rank_choice`): one engine, an engine per API server
    (external balancing, or hybrid with one local engine), or every rank steered by it. Where vLLM routes among
    several engines, another may have room: False.
    """
    parallel, size = _data_parallel(engine_client)
    if size < 2:
        return True
    if _balanced_outside(parallel):
        return getattr(parallel, "data_parallel_size_local", 1) == 1
    return data_parallel_ranks(engine_client) == size


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
