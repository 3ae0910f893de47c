import gzip
import json
import lzma

import pytest

from benchmarks.metrics import SloSpec, Timeline, meets_slo, playback_pause_s, stalled, ttfa_s
from benchmarks.record import (
    SLIM_TICK_S, decode_chunk_lags, encode_chunk_lags, first_audio_s, git_commit, main, read_record, request_timeline,
    slim_record,
)
from tests.benchmarks.synthetic_record import synthetic_record

SLO = SloSpec()


def _record():
    request = {"index": 3, "text": "some words", "num_frames": 20, "status": 200, "outcome": "completed",
               "chunk_times_s": [0.12345678, 0.5, 0.9], "chunk_audio_bytes": [1, 2, 3], "finished_s": 1.00004999}
    return {"modes": {"lanes": {"summaries": [{"rate": 8.0}], "runs": [{"rate": 8.0, "requests": [request]}]}}}


def test_a_slimmed_record_keeps_summaries_and_each_requests_outcome_first_audio_and_chunks(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "record.json").write_text(json.dumps(_record()))
    assert main(["--slim", str(tmp_path / "in"), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "record.json").exists()
    slim = read_record(tmp_path / "out")  # reads record.json.xz
    assert slim == json.loads(lzma.decompress((tmp_path / "out" / "record.json.xz").read_bytes()))
    lanes = slim["modes"]["lanes"]
    assert lanes["summaries"] == [{"rate": 8.0}]
    (request,) = lanes["runs"][0]["requests"]
    assert request["first_audio_s"] == 0.1235 and request["outcome"] == "completed"
    # lags behind playback (1 byte a second here): the first audio none, the next two 0.62 s and 2.22 s ahead
    assert request["chunk_lags_100us"] == [0, -6235, -22235] and request["chunk_audio_bytes"] == [1, 2, 3]
    assert request["finished_s"] == 1.0 and request["num_frames"] == 20  # times to 0.1 ms, counts untouched
    assert "text" not in request and "chunk_times_s" not in request


def test_records_committed_as_gzip_still_read(tmp_path):
    (tmp_path / "record.json.gz").write_bytes(gzip.compress(json.dumps(_record()).encode()))
    assert read_record(tmp_path) == _record()


def test_a_record_file_reads_by_its_own_name(tmp_path):
    (tmp_path / "record_lanes.json.xz").write_bytes(lzma.compress(json.dumps(_record()).encode()))
    (tmp_path / "plain.json").write_text(json.dumps(_record()))
    assert read_record(tmp_path / "record_lanes.json.xz") == read_record(tmp_path / "plain.json") == _record()


def test_the_commit_a_command_names_wins_over_the_trees_git(monkeypatch):
    monkeypatch.delenv("VOXSERVE_COMMIT", raising=False)
    assert git_commit() != "0123abc"
    monkeypatch.setenv("VOXSERVE_COMMIT", "0123abc")
    assert git_commit() == "0123abc"


def _stall_flags_and_pauses(record):
    timelines = [request_timeline(r) for run in record["runs"] for r in run["requests"]]
    return [stalled(t, SLO) for t in timelines], [playback_pause_s(t) for t in timelines], timelines


def test_stalls_recomputed_from_a_slimmed_record_equal_the_full_records(tmp_path):
    full = synthetic_record([20.0, 40.0], window_s=10.0)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "record.json").write_text(json.dumps(full))
    assert main(["--slim", str(tmp_path / "in"), str(tmp_path / "out")]) == 0
    slim = read_record(tmp_path / "out")
    assert "chunk_times_s" not in slim["runs"][0]["requests"][0]
    full_stalls, full_pauses, full_timelines = _stall_flags_and_pauses(full)
    slim_stalls, slim_pauses, slim_timelines = _stall_flags_and_pauses(slim)
    assert sum(full_stalls) > 20 and slim_stalls == full_stalls
    assert max(abs(a - b) for a, b in zip(full_pauses, slim_pauses)) <= SLIM_TICK_S / 2 + 1e-9
    assert [meets_slo(t, SLO) for t in slim_timelines] == [meets_slo(t, SLO) for t in full_timelines]
    assert [len(t.chunk_times_s) for t in slim_timelines] == [len(t.chunk_times_s) for t in full_timelines]
    for a, b in zip(full_timelines, slim_timelines):
        assert (ttfa_s(a) is None) == (ttfa_s(b) is None)
        assert ttfa_s(a) is None or abs(ttfa_s(a) - ttfa_s(b)) <= 1e-4


def test_a_wav_header_chunk_is_not_the_first_audio_and_survives_slimming():
    request = {"scheduled_s": 0.0, "sent_s": 0.001, "outcome": "completed", "bytes_per_second": 100,
               "chunk_times_s": [0.05, 0.12341, 0.5], "chunk_audio_bytes": [0, 50, 50]}
    assert first_audio_s(request) == 0.12341
    slim = slim_record({"runs": [{"requests": [dict(request)]}]})["runs"][0]["requests"][0]
    assert slim["first_audio_s"] == 0.1234 and slim["chunk_lags_100us"] == [-735, 0, -1235]
    assert request_timeline(slim).chunk_times_s == pytest.approx((0.05, 0.1234, 0.5), abs=1e-4)
    assert request_timeline(slim).chunk_times_s[1] == 0.1234
    assert request_timeline(slim).chunk_audio_s == (0.0, 0.5, 0.5)


def test_a_record_slimmed_before_chunks_were_kept_says_stalls_cannot_be_recomputed():
    with pytest.raises(ValueError, match="slimmed without chunk times"):
        request_timeline({"scheduled_s": 0.0, "outcome": "completed", "first_audio_s": 0.1, "num_chunks": 3})


@pytest.mark.parametrize("pause_ms", [9.96, 9.999, 10.0, 10.001, 10.04])
def test_a_pause_next_to_the_stall_threshold_keeps_its_verdict_when_slimmed(pause_ms):
    """0.1 s of audio a chunk: the buffer runs dry at 0.2 s, and the next chunk comes `pause_ms` later."""
    times, sizes = [0.1, 0.2 + pause_ms / 1000, 0.25 + pause_ms / 1000], [10, 10, 10]
    lags = encode_chunk_lags(times, sizes, 100, origin=0.1)
    full = Timeline(0.0, "completed", tuple(times), (0.1, 0.1, 0.1))
    slim = Timeline(0.0, "completed", tuple(decode_chunk_lags(lags, sizes, 100, origin=0.1)), (0.1, 0.1, 0.1))
    assert stalled(slim, SLO) == stalled(full, SLO) == (pause_ms >= 10)
    assert playback_pause_s(slim) == pytest.approx(pause_ms / 1000, abs=SLIM_TICK_S / 2 + 1e-9)
