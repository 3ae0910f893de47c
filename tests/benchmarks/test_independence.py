import subprocess
import sys


def test_benchmarks_import_nothing_of_the_serving_stack():
    # The benchmarks speak to servers over HTTP only (architecture: "apart").
    code = ("import sys, benchmarks.cli, benchmarks.sweep, benchmarks.ablation; "
            "print(sorted(m for m in ('vllm_voxserve', 'vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
