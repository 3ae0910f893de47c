"""`python -m benchmarks text-stream` against the in-process fake server's WebSocket (loopback only)."""

import copy
import json

import pytest

from benchmarks.cli import main
from benchmarks.metrics import COMPLETED, REJECTED, SloSpec, stalled
from benchmarks.record import request_timeline, slim_record
from benchmarks.text_stream import config_message, socket_url, word_messages
from tests.benchmarks.fake_speech_server import FakeBehavior, FakeSpeechServer

TEXTS = ["the quick brown fox jumps", "a STALL right in the middle of it", "please REJECT this one"]


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def run(capsys, tmp_path, server, workload, words_per_s: float, stall_ms: float = 10.0) -> dict:
    out = tmp_path / "out"
    assert main(["text-stream", "--base-url", server.base_url, "--workload", workload, "--rates", "3",
                 "--window-s", "2", "--warmup", "0", "--seeds", "0", "--fixed-length", "--stop-fraction", "0",
                 "--text-words-per-s", str(words_per_s), "--stall-ms", str(stall_ms), "--slo-ms", "500",
                 "--out", str(out), "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    record = json.loads((out / "record.json").read_text())
    assert lines == record["summary"] and record["kind"] == "text-stream"
    assert record["config"]["text_words_per_s"] == words_per_s
    return record


def by_text(record: dict) -> dict[str, list[dict]]:
    requests = [r for run in record["runs"] for r in run["requests"]]
    return {marker: [r for r in requests if marker in r["text"]] for marker in ("quick", "STALL", "REJECT")}


def test_words_go_out_at_the_rate_and_every_chunk_is_recorded(tmp_path, workload, capsys):
    with FakeSpeechServer(FakeBehavior(first_audio_delay_s=0.05, stall_gap_s=0.5)) as server:
        record = run(capsys, tmp_path, server, workload, words_per_s=20)
    requests = by_text(record)
    assert requests["quick"] and requests["STALL"] and requests["REJECT"]
    for r in requests["quick"]:
        assert r["outcome"] == COMPLETED and r["close_code"] == 1000
        gaps = [b - a for a, b in zip(r["word_sent_s"], r["word_sent_s"][1:])]
        assert len(r["word_sent_s"]) == 5 and all(0.03 < g < 0.08 for g in gaps)
        assert r["sent_s"] == r["word_sent_s"][0] >= r["connected_s"]
        assert r["chunk_audio_bytes"] == [9600] * 5 and r["event_audio_s"] == [0.2] * 5
        assert r["chunk_times_s"][0] - r["sent_s"] >= 0.05  # TTFA counts from the first word
    for r in requests["REJECT"]:
        assert r["outcome"] == REJECTED and r["close_code"] == 1013 and r["retry_after"] == "1.0"
    # the server sat on text it had: a stall; the quick texts kept up
    summary = record["summaries"][0]
    assert summary["num_stalled"] == len(requests["STALL"])
    assert summary["num_rejected"] == len(requests["REJECT"])
    # the socket got the sweep's request fields as its config, and the words joined back into the text
    messages = server.socket_messages[0]
    assert messages[0]["type"] == "config" and "input" not in messages[0] and "stream" not in messages[0]
    assert messages[0]["ignore_eos"] is True and messages[0]["response_format"] == "pcm"


def test_pauses_waiting_for_slow_text_are_not_stalls(tmp_path, workload, capsys):
    # 2 words/s for 0.2 s of audio a word: the player runs dry 0.3 s before every word, the server's fault never
    with FakeSpeechServer(FakeBehavior(first_audio_delay_s=0.01, stall_gap_s=0.5)) as server:
        record = run(capsys, tmp_path, server, workload, words_per_s=2, stall_ms=60)
    requests = by_text(record)
    quick = requests["quick"]
    assert quick and all(r["outcome"] == COMPLETED for r in quick)
    for r in quick:  # the pauses were there ...
        times = r["chunk_times_s"]
        assert times[-1] - times[0] > 4 * 0.45
    # ... but only the STALL texts' count
    assert record["summaries"][0]["num_stalled"] == len(requests["STALL"]) > 0
    # and so they do when the record is read back, full or slimmed
    slo = SloSpec(0.5, 0.06)
    for body in (record, slim_record(copy.deepcopy(record))):
        recorded = [r for run in body["runs"] for r in run["requests"] if r["outcome"] == COMPLETED]
        assert sum(stalled(request_timeline(r), slo) for r in recorded) == len(requests["STALL"])


def test_pieces_of_a_text_and_the_config_message():
    assert word_messages("Hello  there, world.") == ["Hello ", "there, ", "world."]
    assert "".join(word_messages("one two")) == "one two"
    payload = {"input": "hi", "stream": True, "voice": "ryan", "seed": 3, "response_format": "pcm"}
    assert config_message(payload) == {"type": "config", "voice": "ryan", "seed": 3, "response_format": "pcm"}
    assert socket_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/v1/audio/speech/stream"
    assert socket_url("https://tts.example") == "wss://tts.example/v1/audio/speech/stream"
