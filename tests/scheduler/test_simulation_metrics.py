import json

import pytest

from benchmarks.simulation.__main__ import main
from benchmarks.simulation.slo import RequestOutcome, slo_capacity
from benchmarks.simulation.sweep import parse_rates
from benchmarks.simulation.workload import FRAMES_PER_WORD, load_word_counts, poisson_workload


def outcome(audio, arrival=0.0):
    return RequestOutcome("r", arrival, completed=True, audio=audio)


def test_player_pauses_and_stalls():
    on_time = outcome([(0.15, 0.8), (0.9, 0.8), (1.74, 0.8)])  # each chunk before the audio runs out
    assert on_time.ttfa_s() == pytest.approx(0.15) and on_time.pause_s() == 0.0 and on_time.meets_slo(0.2)
    short_pause = outcome([(0.15, 0.8), (0.959, 0.8)])  # 9 ms gap: tolerated
    assert short_pause.pause_s() == pytest.approx(0.009) and short_pause.meets_slo(0.2)
    stalled = outcome([(0.15, 0.8), (0.95, 0.8), (1.8, 0.8)])  # 0 + 50 ms pause
    assert stalled.pause_s() == pytest.approx(0.05) and not stalled.meets_slo(0.2)
    assert not outcome([(0.25, 0.8)]).meets_slo(0.2)  # TTFA over T
    assert not RequestOutcome("r", 0.0, rejected=True).meets_slo(0.2)


def test_capacity_is_the_highest_rate_with_every_lower_rate_attained():
    assert slo_capacity({10: 1.0, 20: 0.95, 30: 0.85, 40: 0.95}, 0.9) == 20
    assert slo_capacity({10: 0.5}, 0.9) == 0.0


def test_rates_and_workload():
    assert parse_rates("30:36:2") == [30, 32, 34, 36] and parse_rates("5,7") == [5, 7]
    requests = poisson_workload(50, 20.0, seed=3, word_counts=[10, 20, 30])
    assert 800 < len(requests) < 1200
    assert all(a.arrival_time < b.arrival_time for a, b in zip(requests, requests[1:]))
    assert {r.expected_frames for r in requests} == {round(FRAMES_PER_WORD * w) for w in (10, 20, 30)}
    assert requests == poisson_workload(50, 20.0, seed=3, word_counts=[10, 20, 30])  # seeded


def test_the_short_utterance_workload_keeps_the_texts_of_at_most_so_many_words(tmp_path):
    texts = tmp_path / "texts.tsv"
    texts.write_text("utt_id\ttext\na\tone two three\nb\tone\nc\t" + "w " * 20 + "\n", encoding="utf-8")
    assert load_word_counts(texts) == [3, 1, 20]
    assert load_word_counts(texts, max_words=3) == [3, 1]
    with pytest.raises(ValueError, match="max_words"):
        load_word_counts(texts, max_words=0)
    libritts = load_word_counts(max_words=12)
    assert libritts and max(libritts) <= 12 and len(libritts) < len(load_word_counts())


def test_cli_prints_capacity_and_goodput_per_overload_factor_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["--modes", "deadline_aware_shed", "--rates", "8,16", "--window", "3", "--overload-factors",
                 "1.5,2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and "capacity" in lines[0]
    assert lines[1].startswith("goodput at 24 req/s (1.5x)") and lines[2].startswith("goodput at 32 req/s (2x)")
    data = json.loads(out.read_text())
    assert data["capacity_90"]["deadline_aware_shed"] == 16
    assert set(data["overload"]) == {"1.5", "2"} and data["overload"]["2"]["rate"] == 32
    assert len(data["results"]["deadline_aware_shed"]) == 2
    assert data["max_words"] is None
    batches = data["results"]["deadline_aware_shed"][0]["codec_batches"]
    assert batches["urgent_batches"] > 0 and batches["urgent_chunks"] >= batches["urgent_batches"]


def test_cli_runs_the_short_utterance_workload(tmp_path):
    out = tmp_path / "short.json"
    assert main(["--modes", "deadline_aware_shed", "--rates", "8", "--window", "3", "--max-words", "12",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_words"] == 12 and data["results"]["deadline_aware_shed"][0]["offered"] > 0
