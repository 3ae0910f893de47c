"""The closed-loop mode against the in-process fake server (loopback only): exactly C requests in flight per level,
both request profiles, and the short-utterance workload."""

import json

import pytest

from benchmarks.cli import main
from tests.benchmarks.fake_speech_server import FakeBehavior, FakeSpeechServer

pytestmark = pytest.mark.slow
TEXTS = ["one two three four five six seven eight nine ten", "a short one", "just two", "three words here"]


def most_in_flight(requests):
    """The most requests between their sending and their end at any one time."""
    events = sorted([(r["sent_s"], 1) for r in requests] + [(r["finished_s"], -1) for r in requests])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("profile", ["ours", "vllm-omni"])
def test_each_level_keeps_exactly_c_requests_in_flight(tmp_path, capsys, profile):
    workload = tmp_path / "texts.txt"
    workload.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "closed"
    # first audio 20 ms plus 30 ms per request in flight: TTFA grows with the level
    with FakeSpeechServer(FakeBehavior(delay_per_active_s=0.03, num_chunks=2)) as server:
        assert main(["concurrency", "--base-url", server.base_url, "--profile", profile, "--workload", str(workload),
                     "--max-words", "3", "--fixed-length", "--levels", "1,4", "--requests-per-level", "8",
                     "--seeds", "0,1", "--warmup", "2", "--out", str(out), "--no-progress"]) == 0
        payloads = server.payloads
    lines = capsys.readouterr().out.strip().splitlines()
    record = json.loads((out / "record.json").read_text())
    assert record["kind"] == "concurrency" and record["stop_reason"] == "all levels run"
    assert record["config"]["load"]["max_words"] == 3 and record["config"]["load"]["profile"]["name"] == profile
    assert [(run["concurrency"], run["seed"]) for run in record["runs"]] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    for run in record["runs"]:
        assert len(run["requests"]) == 8 and most_in_flight(run["requests"]) == run["concurrency"]
        assert all(r["outcome"] == "completed" and len(r["text"].split()) <= 3 for r in run["requests"])
    one, four = record["levels"]
    assert (one["concurrency"], four["concurrency"]) == (1, 4) and one["num_requests"] == four["num_requests"] == 16
    # alone, a request waits 20 + 30 ms for its first audio; four at once wait 20 + 30 ms for each in flight
    assert 0.05 <= one["ttfa_p50_s"] < four["ttfa_p50_s"] and four["ttfa_p50_s"] >= 0.08
    assert four["ttfa_p95_s"] <= four["ttfa_p99_s"]
    assert one["rtf_mean"] > 0 and one["audio_s_per_wall_s"] > 0 and one["num_failed"] == 0
    assert four["audio_s_per_wall_s"] > one["audio_s_per_wall_s"]  # four streams at once deliver more audio
    assert len(lines) == 2 and lines[1].startswith(f"{profile}: 4 concurrent: TTFA p50/p95/p99")
    measured = payloads[2:]  # after the warm-up
    assert len(measured) == 32 and all(len(p["input"].split()) <= 3 for p in measured)
    frames = [round(len(p["input"].split()) * 5.2) for p in measured]
    if profile == "ours":
        assert [p["max_new_tokens"] for p in measured] == [f + 1 for f in frames]
        assert all(p["ignore_eos"] and "seed" in p for p in measured)
    else:
        assert [p["max_new_tokens"] for p in measured] == frames
        assert all(p["task_type"] == "CustomVoice" and "seed" not in p and "ignore_eos" not in p for p in measured)


def test_refused_and_failed_requests_are_counted_per_level(tmp_path, capsys):
    workload = tmp_path / "texts.txt"
    workload.write_text("fine text\nREJECT me\nFAIL me\n")
    out = tmp_path / "closed"
    with FakeSpeechServer() as server:
        assert main(["concurrency", "--base-url", server.base_url, "--workload", str(workload), "--levels", "2",
                     "--requests-per-level", "6", "--warmup", "0", "--out", str(out), "--no-progress"]) == 0
    (level,) = json.loads((out / "record.json").read_text())["levels"]
    assert (level["num_completed"], level["num_rejected"], level["num_failed"]) == (2, 2, 2)  # each text twice
