"""Every patch of vLLM internals, in one place. Each names its target, the vLLM version it was read from, and why.

Pinned: vLLM 0.26.0. `tests/test_compat.py` checks that each target still exists with the expected shape.
"""

from __future__ import annotations

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
