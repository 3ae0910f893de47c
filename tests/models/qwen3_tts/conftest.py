import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def official_python() -> str:
    """Python of the environment that runs the official qwen-tts 0.1.1 code (built once by scripts/install_parity.sh)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_parity.sh")], check=True, capture_output=True, text=True
    )
    python = os.path.join(out.stdout.strip().splitlines()[-1], "bin", "python")
    assert os.path.exists(python), python
    return python


def run_official(official_python: str, script: Path, *args: str, timeout: float = 900) -> None:
    """Run one of the official-side scripts (tests/models/qwen3_tts/official/*.py) in the official environment."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run(
        [official_python, str(script), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
