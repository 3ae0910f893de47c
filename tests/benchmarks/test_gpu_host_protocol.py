"""The measurement protocol (benchmarks/gpu_host/protocol.sh): its mode switch against the fake speech server (a
refused switch stops the script before any sweep runs under the wrong mode's label), its wait's deadline and the host
measured again after a sweep, and the overload stage's rates."""

import json
import os
import socket
import subprocess
import sys
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


def test_a_wait_that_finds_its_sweep_ended_measures_the_idle_host_again(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    ended = subprocess.run(["bash", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    for name in ("sweep_x", "overload_x"):  # each a sweep whose process is gone
        (work / f"{name}.pid").write_text(ended)
        (work / f"{name}.txt").write_text("64 req/s: attainment 100.0%\n")
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "LABEL": "x", "STAGES": "wait", "PORT": "9"}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert "sweep_x: ended" in done.stdout
    assert json.loads((out / "host_after_sweep_x.json").read_text())["python_per_s"] > 0
    assert "overload_x: ended" in done.stdout and not (out / "host_after_overload_x.json").exists()  # once a start


def test_a_new_sweep_forgets_the_host_measured_after_the_last_one_of_its_label(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    stale = work / "host_after_sweep_x.json"
    stale.write_text(json.dumps({"python_per_s": 48076.0}))  # a former start's, on this host
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "LABEL": "x", "STAGES": "sweep", "PORT": "9",
           "START_RATE": "8"}
    try:
        done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (work / "sweep_x.pid").exists() and not stale.exists()
    finally:  # the sweep it started in the background (against no server)
        pid = work / "sweep_x.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)


def overload(tmp_path: Path, record: dict | None, extra: dict | None = None) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    (work / "sweep_x").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    if record is not None:
        (work / "sweep_x" / "record.json").write_text(json.dumps(record))
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(work), "LABEL": "x", "STAGES": "overload",
           "PORT": "9", **(extra or {})}
    if "RATES" not in (extra or {}):
        env.pop("RATES", None)
    try:
        return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                              capture_output=True, text=True, env=env, timeout=60)
    finally:  # the overload sweep it started in the background (against no server: it ends on its own)
        pid = work / "overload_x.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)


def test_the_overload_rates_are_1_5_and_2_times_the_finished_sweeps_99_percent_capacity(tmp_path):
    done = overload(tmp_path, {"capacity": {"0.90": 120.0, "0.99": 112.0}})
    assert done.returncode == 0, done.stderr
    assert "overload rates: 168,224 req/s" in done.stdout
    assert (tmp_path / "work" / "overload_x.pid").exists()


def test_explicit_overload_rates_win(tmp_path):
    done = overload(tmp_path, {"capacity": {"0.99": 112.0}}, {"RATES": "144,192"})
    assert "overload rates: 144,192 req/s" in done.stdout


def test_an_overload_without_a_sweeps_capacity_asks_for_rates_and_starts_nothing(tmp_path):
    for record in (None, {"capacity": {"0.99": 0.0}}):
        done = overload(tmp_path, record)
        assert done.returncode == 1 and "set RATES" in done.stderr
        assert not (tmp_path / "work" / "overload_x.pid").exists()


def test_an_overload_waits_for_the_sweep_to_finish(tmp_path):
    sweep = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / "work").mkdir()
        (tmp_path / "work" / "sweep_x.pid").write_text(str(sweep.pid))
        done = overload(tmp_path, {"capacity": {"0.99": 96.0}})
        assert done.returncode == 1 and "sweep_x is still running" in done.stderr
        assert not (tmp_path / "work" / "overload_x.pid").exists()
    finally:
        sweep.kill()


def stop(tmp_path: Path, port: int) -> subprocess.CompletedProcess:
    (tmp_path / "out").mkdir(exist_ok=True)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "STAGES": "stop",
           "PORT": str(port), "STOP_S": "1"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol.sh")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)


def test_stop_returns_once_nothing_answers_and_fails_while_a_server_still_does(tmp_path):
    """The next `serve` reuses a server that still answers /health, so a stop that left one must say so."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert stop(tmp_path, port).returncode == 0
    served = tmp_path / "served"
    served.mkdir()
    (served / "health").write_text("ok")  # GET /health answers 200
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(served)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/health"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        done = stop(tmp_path, port)
        assert done.returncode == 1 and "a server still answers" in done.stderr
    finally:
        server.kill()
