"""The package's architecture, read from its imports (every `import`, at module level or inside a function).

Layers, lowest first; a module may import its own layer and the layers its rule names, nothing else:

    contract      what crosses a process boundary (request keys, step report, rejections, RPC names, audio rate)
    policy        scheduler/ (but its adapter): the pure scheduling policy, run on a simulated clock in tests
    shared        config, serving defaults, the audio channel, step logs, engine speech counters, fault injection,
                  threads' CPU shares, garbage collections' pauses
    models        models/: the speech models, torch only
    codec_lanes   codec_lanes/: the codec's SM partitions and lanes, built on the models' codec programs
    adapters      the vLLM side, one folder per process role:
                    scheduler/adapter.py and text_adapter.py (engine core), worker/ (worker),
                    entrypoints/ (API server),
                    plugin.py, vllm_hooks.py and compat.py (every process)

The adapters depend on the policy and the models, never the other way round; the three process roles never import
one another (they meet only in `contract`); vLLM is imported by adapter modules only; no import circles.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "vllm_voxserve"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# (layer, module prefixes): the first layer whose prefix matches a module is its layer.
LAYERS = [
    ("contract", ["contract"]),
    ("engine_core", ["scheduler.adapter", "scheduler.text_adapter"]),
    ("policy", ["scheduler"]),
    ("shared", ["config", "serving_defaults", "transport", "step_host_times", "speech_stats", "fault_injection",
                "thread_cpu", "gc_pauses"]),
    ("models", ["models"]),
    ("codec_lanes", ["codec_lanes"]),
    ("worker", ["worker"]),
    ("api_server", ["entrypoints"]),
    ("vllm_internals", ["vllm_hooks", "compat"]),
    ("plugin", ["plugin"]),
    ("package", [""]),
]

MAY_IMPORT = {
    "contract": set(),
    "policy": {"contract"},
    "shared": {"contract", "policy"},  # the config builds the policy's own config
    "models": {"contract", "shared"},
    "codec_lanes": {"contract", "shared", "models"},
    "vllm_internals": {"contract"},
    "engine_core": {"contract", "policy", "shared", "vllm_internals"},
    "worker": {"contract", "policy", "shared", "models", "codec_lanes", "vllm_internals"},
    # the edge guard holds the policy's concurrency limit; compat reaches vLLM's private data-parallel client
    "api_server": {"contract", "policy", "shared", "models", "vllm_internals"},
    "plugin": {"contract", "shared", "models", "vllm_internals", "worker"},  # the config hook lives with the worker
    "package": set(),
}

# The adapter modules: the only ones that may import vLLM.
VLLM_IMPORTERS = ["vllm_hooks", "compat", "plugin", "scheduler.adapter", "scheduler.text_adapter", "worker",
                  "entrypoints.speech_plugin", "entrypoints.speech_service", "models.qwen3_tts.vllm_model"]
# No torch where the policy and the contract must run without it.
TORCH_FREE_LAYERS = {"contract", "policy"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported_names(path: Path, module: str) -> set[str]:
    """Absolute dotted names of what `path` imports, anywhere in it (package-relative names stay relative)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [PACKAGE, *module.split(".")] if module else [PACKAGE]
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            names.add(parent)
            names.update(f"{parent}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return names


def import_graph() -> dict[str, set[str]]:
    """Package-relative module -> the package modules it imports."""
    modules = all_modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                relative = name[len(PACKAGE) + 1:]
                if relative in modules and relative != module:
                    targets.add(relative)
        graph[module] = targets
    return graph


def layer_of(module: str) -> str:
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") or prefix == "":
                return layer
    raise AssertionError(module)


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        for target in sorted(targets):
            target_layer = layer_of(target)
            if target_layer != layer and target_layer not in MAY_IMPORT[layer] and target_layer != "package":
                found.append(f"{module} ({layer}) imports {target} ({target_layer})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def external_imports(top: str) -> list[str]:
    found = []
    for module, path in all_modules().items():
        if any(name.split(".")[0] == top for name in imported_names(path, module)):
            found.append(module)
    return sorted(found)


def test_every_module_has_a_layer():
    assert all(layer_of(m) != "package" for m in all_modules() if m)


def test_no_layer_imports_one_it_must_not():
    assert back_edges(import_graph()) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_only_adapters_import_vllm():
    def adapter(module: str) -> bool:
        return any(module == a or module.startswith(a + ".") for a in VLLM_IMPORTERS)

    assert [m for m in external_imports("vllm") if not adapter(m)] == []


def test_contract_and_policy_import_no_torch():
    assert [m for m in external_imports("torch") if layer_of(m) in TORCH_FREE_LAYERS] == []


def test_the_checks_catch_a_back_edge_and_a_circle():
    graph = {"models.a": {"worker.b"}, "worker.b": {"models.a"}, "contract": set()}
    assert back_edges(graph) == ["models.a (models) imports worker.b (worker)"]
    assert cycles(graph) == [["models.a", "worker.b"]]


def test_function_level_and_relative_imports_are_read(tmp_path):
    source = tmp_path / "talker.py"
    source.write_text("def f():\n    from .code_predictor import CodePredictor\n    import vllm.config\n")
    names = imported_names(source, "models.qwen3_tts.talker")
    assert f"{PACKAGE}.models.qwen3_tts.code_predictor" in names and "vllm.config" in names
