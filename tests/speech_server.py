"""Start a real `vllm serve` with the voxserve plugin on a tiny random checkpoint (tests and the demo)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

SERVED_NAME = "qwen3-tts-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tiny_checkpoint(out: Path, kind: str = "custom_voice", seed: int = 0) -> Path:
    from vllm_voxserve.models.qwen3_tts.checkpoint import make_checkpoint

    if not (out / "config.json").exists():
        make_checkpoint(out, "tiny", kind, "float32", seed)
    return out


def vllm_command() -> str:
    """The `vllm` console script of this Python environment."""
    candidate = Path(sys.executable).with_name("vllm")
    return str(candidate) if candidate.exists() else (shutil.which("vllm") or "vllm")


@contextlib.contextmanager
def speech_server(checkpoint: Path | str, *, spelling: str = "env", extra_args: tuple[str, ...] = (),
                  log_path: Path | None = None, timeout_s: float = 600, env: dict[str, str] | None = None):
    """Yield the base URL of a running server. checkpoint: a folder or a hub repo id. spelling: "env"
    (VLLM_PLUGINS=voxserve) or "flag" (--plugin). env: extra environment variables of the server."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_LOGGING_LEVEL="INFO", **(env or {}))
    cmd = [vllm_command(), "serve", str(checkpoint), "--port", str(port), "--host", "127.0.0.1",
           "--served-model-name", SERVED_NAME, "--max-model-len", "2048", "--max-num-seqs", "16",
           "--kv-cache-memory-bytes", str(128 << 20), "--enforce-eager", "--dtype", "float32", *extra_args]
    if spelling == "env":
        env["VLLM_PLUGINS"] = "voxserve"
    elif spelling == "flag":
        env.pop("VLLM_PLUGINS", None)
        cmd += ["--plugin", "voxserve"]
    else:
        raise ValueError(spelling)
    log = open(log_path or os.devnull, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}; log: {log_path}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve not healthy after {timeout_s} s; log: {log_path}")
            time.sleep(2)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
