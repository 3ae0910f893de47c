"""The compile cache file: a fresh process (its own empty inductor cache) that loads it hits instead of compiling."""

import os
import subprocess
import sys

from vllm_voxserve.worker import compile_cache
from vllm_voxserve.worker.compile_cache import ENV_VAR, cache_path, load_compile_cache, save_compile_cache

# One process of a server's life: load the file if any, compile the named steps, save; prints inductor's counters.
PROCESS = """
import sys
import torch
from torch._dynamo.utils import counters
from vllm_voxserve.models.qwen3_tts.codec_program import _OwnInductor
from vllm_voxserve.worker.compile_cache import cache_path, load_compile_cache, save_compile_cache
steps = {"a": lambda x: torch.sin(x) * 2 + x.cos(), "b": lambda x: torch.tanh(x) * 3 - x.exp()}
backends = {"a": "inductor", "b": _OwnInductor(None, {}, None)}  # b compiled as the codec program compiles
loaded = load_compile_cache(cache_path())
for name in sys.argv[1]:
    torch.compile(steps[name], backend=backends[name])(torch.randn(8))
saved = save_compile_cache(cache_path())
print(loaded, saved, counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


def _run_process(tmp_path, name, cache_file, steps):
    env = {**os.environ, ENV_VAR: str(cache_file), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROCESS, steps], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, saved, hits, misses = done.stdout.split()[-4:]
    return loaded == "True", saved == "True", int(hits), int(misses)


def test_a_fresh_process_hits_what_the_ones_before_compiled(tmp_path):
    cache_file = tmp_path / "cache" / "compile_cache.bin"
    assert _run_process(tmp_path, "first", cache_file, "a") == (False, True, 0, 1)
    assert cache_file.is_file() and not list(cache_file.parent.glob(".*"))  # written whole, no partial left
    # changed code compiles one new graph: the file is written again, with the graph it hit as well
    assert _run_process(tmp_path, "second", cache_file, "ab") == (True, True, 1, 1)
    assert _run_process(tmp_path, "third", cache_file, "ab") == (True, False, 2, 0)  # all hits: left as it is


def test_without_the_variable_nothing_is_read_or_written(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert cache_path() is None
    assert not load_compile_cache(None) and not save_compile_cache(None)


def test_a_missing_or_damaged_file_only_means_compiling(tmp_path, caplog):
    assert not load_compile_cache(tmp_path / "absent.bin")
    damaged = tmp_path / "damaged.bin"
    damaged.write_bytes(b"not a cache")
    with caplog.at_level("WARNING", logger=compile_cache.__name__):
        assert not load_compile_cache(damaged)
    assert "not loaded" in caplog.text
