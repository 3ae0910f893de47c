"""The measurement protocol (benchmarks/gpu_host/protocol.sh): its mode switch against the fake speech server (a
refused switch stops the script before any sweep runs under the wrong mode's label), and its wait's deadline."""

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from tests.benchmarks.fake_speech_server import FakeBehavior, FakeSpeechServer

ROOT = Path(__file__).resolve().parents[2]


def protocol(server: FakeSpeechServer, tmp_path: Path, stages: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "MODE": "vllm-stock",
           "PORT": str(urlparse(server.base_url).port), "STAGES": stages, "START_RATE": "8"}
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_refused_switch_stops_the_protocol_before_its_sweep(tmp_path):
    behavior = FakeBehavior(modes={"lanes": 0.02, "vllm-stock": 0.02}, broken_modes=("vllm-stock",))
    with FakeSpeechServer(behavior) as server:
        server.mode = "lanes"
        done = protocol(server, tmp_path, "mode sweep")
        assert done.returncode == 1
        assert "the switch to vllm-stock was refused" in done.stderr
        assert server.mode == "lanes"
    assert not (tmp_path / "work" / "sweep_vllm-stock.pid").exists()


def test_an_accepted_switch_lets_the_protocol_go_on(tmp_path):
    with FakeSpeechServer(FakeBehavior(modes={"lanes": 0.02, "vllm-stock": 0.02})) as server:
        server.mode = "lanes"
        done = protocol(server, tmp_path, "mode")
        assert done.returncode == 0, done.stderr
        assert server.mode == "vllm-stock"
        assert "HTTP 200" in done.stdout


def test_a_wait_counts_call_s_from_the_commands_start_where_one_is_given(tmp_path):
    """Several runs of the script in one limited command: the last one's wait ends CALL_S after the command began,
    not after the run began (which would outlast the command)."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "out").mkdir()
    sweep = subprocess.Popen(["sleep", "300"])  # a sweep that outlives the command
    try:
        (work / "sweep_x.pid").write_text(str(sweep.pid))
        env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(work), "LABEL": "x", "STAGES": "wait",
               "CALL_S": "600", "CALL_STARTED": str(int(time.time()) - 590)}
        done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                              capture_output=True, text=True, env=env, timeout=90)
        assert "sweep_x: still running" in done.stdout
    finally:
        sweep.kill()
