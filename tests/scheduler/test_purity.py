"""The policy package must run without vLLM or torch (a simulated clock, CI without GPUs)."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = {"adapter", "text_adapter"}  # the modules allowed to import vLLM (the engine core's adapter)

PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    BLOCKED = ("torch", "vllm")

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"policy code imported {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import vllm_voxserve.scheduler as pkg
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name not in {adapters!r}]
    for name in names:
        importlib.import_module(f"vllm_voxserve.scheduler.{{name}}")
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names))
    """
)


def test_policy_package_imports_neither_vllm_nor_torch():
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(adapters=ADAPTERS)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 10  # every policy module was imported


def test_the_probe_would_catch_an_import():
    probe = PROBE.format(adapters=ADAPTERS).replace("import vllm_voxserve.scheduler as pkg", "import torch")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "policy code imported torch" in result.stderr
