"""TTFA over a probe's window, per bin of scheduled sending time, from full and slimmed records."""

import json

from benchmarks.ttfa_drift import drift, main


def request(scheduled, ttfa, slim=False):
    sent = None if ttfa == "unsent" else scheduled + 0.001
    first = None if ttfa in (None, "unsent") else sent + ttfa
    body = {"scheduled_s": scheduled, "sent_s": sent}
    if slim:
        return {**body, "first_audio_s": first}
    return {**body, "chunk_times_s": [] if first is None else [first, first + 0.5]}


def test_medians_per_bin_and_requests_without_audio():
    requests = [request(0.1, 0.09), request(0.5, 0.11), request(1.2, 0.2, slim=True), request(1.9, None),
                request(2.5, 0.4), request(3.1, "unsent"), request(3.99, 0.8)]
    bins = drift(requests, window_s=4.0, bin_s=1.0)
    medians = [None if m is None else round(m, 3) for m, _, _ in bins]
    assert medians == [0.1, 0.2, 0.4, 0.8]
    assert [(n, missing) for _, n, missing in bins] == [(2, 0), (2, 1), (1, 0), (2, 1)]


def test_a_request_scheduled_past_the_window_counts_in_its_last_bin():
    assert [n for _, n, _ in drift([request(4.2, 0.1)], window_s=4.0, bin_s=2.0)] == [0, 1]


def test_command_prints_one_line_per_run_of_the_chosen_mode(tmp_path, capsys):
    run = {"rate": 8.0, "seed": 0, "window_s": 2.0, "elapsed_s": 2.1, "settled_early": True,
           "requests": [request(0.2, 0.1), request(1.5, 0.3)]}
    record = {"modes": {"lanes": {"runs": [run]}, "inline": {"runs": [{**run, "seed": 1}]}}}
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert main([str(tmp_path), "--bin-s", "1", "--mode", "lanes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["lanes 8 req/s seed 0 (2.1 s, ended early): TTFA p50 ms per bin 100 300; no audio 0 0"]
