"""A short sweep, and a short text-stream sweep over the WebSocket, against a real running server (the CPU server in
CI), checking that the outputs are produced.

Without VOXSERVE_BENCH_URL it starts our CPU server on a tiny random checkpoint (minutes on a 2-core machine).
Or set VOXSERVE_BENCH_URL to a running server's base URL (loopback), e.g. http://127.0.0.1:8000; optionally
VOXSERVE_BENCH_MODEL (the served model name) and VOXSERVE_BENCH_ARGS (extra CLI arguments, shell-split; default
"--voice ryan").
"""

import json
import os
import shlex

import pytest

from benchmarks.cli import main

pytestmark = [pytest.mark.server, pytest.mark.slow]
TEXTS = ["Hello there.", "A short sentence to speak.", "Good morning to you.", "One more little line."]


def short_sweep(base_url, out_dir, extra_args=()):
    """Two low rates x 4 s windows with fixed lengths; returns the parsed record. Callable from a server fixture."""
    workload = out_dir / "texts.txt"
    workload.parent.mkdir(parents=True, exist_ok=True)
    workload.write_text("\n".join(TEXTS) + "\n")
    args = ["sweep", "--base-url", base_url, "--workload", str(workload), "--rates", "0.5,1", "--window-s", "4",
            "--warmup", "1", "--fixed-length", "--request-timeout-s", "120", "--stop-fraction", "0",
            "--out", str(out_dir), "--no-progress", *extra_args]
    assert main(args) == 0
    record = json.loads((out_dir / "record.json").read_text())
    for png in ("attainment.png", "ttfa_p99.png", "goodput.png"):
        assert (out_dir / png).read_bytes()[:4] == b"\x89PNG"
    return record


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """VOXSERVE_BENCH_URL if set, else our CPU server on a tiny random checkpoint (tests/speech_server.py)."""
    if os.environ.get("VOXSERVE_BENCH_URL"):
        yield os.environ["VOXSERVE_BENCH_URL"], os.environ.get("VOXSERVE_BENCH_MODEL")
        return
    try:
        from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server
    except ImportError as exc:
        pytest.skip(f"no running server (VOXSERVE_BENCH_URL) and cannot start one: {exc}")
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    log = tmp_path_factory.mktemp("logs") / "serve-bench.log"
    with speech_server(checkpoint, log_path=log) as url:
        yield url, SERVED_NAME


def test_short_sweep_against_the_cpu_server(server_url, tmp_path):
    base_url, model = server_url
    extra = shlex.split(os.environ.get("VOXSERVE_BENCH_ARGS", "--voice ryan"))
    if model:
        extra += ["--model", model]
    record = short_sweep(base_url, tmp_path / "live", extra)
    requests = [r for run in record["runs"] for r in run["requests"]]
    assert [s["rate"] for s in record["summaries"]] == [0.5, 1.0] and requests
    completed = [r for r in requests if r["outcome"] == "completed"]
    assert completed, f"no request completed: {[r['error'] for r in requests][:3]}"
    for r in completed:  # fixed length: 5.2 frames per word, 1920 samples (80 ms) per frame, 2 bytes each
        assert sum(r["chunk_audio_bytes"]) == r["num_frames"] * 1920 * 2
    if not os.environ.get("VOXSERVE_BENCH_URL"):  # our vLLM server: its /metrics gauges gate each window
        assert all(run["idle_wait_s"] is not None for run in record["runs"])


def test_short_text_stream_against_the_cpu_server(server_url, tmp_path):
    base_url, model = server_url
    extra = shlex.split(os.environ.get("VOXSERVE_BENCH_ARGS", "--voice ryan"))
    if model:
        extra += ["--model", model]
    workload = tmp_path / "texts.txt"
    workload.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "text-stream"
    assert main(["text-stream", "--base-url", base_url, "--workload", str(workload), "--rates", "0.5",
                 "--window-s", "4", "--warmup", "1", "--fixed-length", "--request-timeout-s", "120",
                 "--text-words-per-s", "4", "--stop-fraction", "0", "--out", str(out), "--no-progress", *extra]) == 0
    record = json.loads((out / "record.json").read_text())
    requests = [r for run in record["runs"] for r in run["requests"]]
    completed = [r for r in requests if r["outcome"] == "completed"]
    assert completed, f"no request completed: {[r['error'] for r in requests][:3]}"
    for r in completed:
        assert sum(r["chunk_audio_bytes"]) == r["num_frames"] * 1920 * 2 and r["close_code"] == 1000
        assert len(r["word_sent_s"]) == r["num_words"] and r["end_sent_s"] >= r["word_sent_s"][-1]
        assert sum(r["event_audio_s"]) == pytest.approx(r["num_frames"] * 0.08)
        # one event per binary message, and the words went out at 4 a second
        assert len(r["event_audio_s"]) == len(r["chunk_times_s"])
        assert r["word_sent_s"][-1] - r["word_sent_s"][0] == pytest.approx((r["num_words"] - 1) / 4, abs=0.1)
