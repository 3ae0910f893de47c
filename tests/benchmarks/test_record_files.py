import gzip
import json
import lzma

from benchmarks.record import git_commit, main, read_record


def _record():
    request = {"index": 3, "text": "some words", "num_frames": 20, "status": 200, "outcome": "completed",
               "chunk_times_s": [0.12345678, 0.5, 0.9], "chunk_audio_bytes": [1, 2, 3], "finished_s": 1.00004999}
    return {"modes": {"lanes": {"summaries": [{"rate": 8.0}], "runs": [{"rate": 8.0, "requests": [request]}]}}}


def test_a_slimmed_record_keeps_summaries_and_each_requests_outcome_and_first_audio(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "record.json").write_text(json.dumps(_record()))
    assert main(["--slim", str(tmp_path / "in"), str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "record.json").exists()
    slim = read_record(tmp_path / "out")  # reads record.json.xz
    assert slim == json.loads(lzma.decompress((tmp_path / "out" / "record.json.xz").read_bytes()))
    lanes = slim["modes"]["lanes"]
    assert lanes["summaries"] == [{"rate": 8.0}]
    (request,) = lanes["runs"][0]["requests"]
    assert request["first_audio_s"] == 0.1235 and request["num_chunks"] == 3 and request["outcome"] == "completed"
    assert request["finished_s"] == 1.0 and request["num_frames"] == 20  # times to 0.1 ms, counts untouched
    assert "text" not in request and "chunk_times_s" not in request


def test_records_committed_as_gzip_still_read(tmp_path):
    (tmp_path / "record.json.gz").write_bytes(gzip.compress(json.dumps(_record()).encode()))
    assert read_record(tmp_path) == _record()


def test_the_commit_a_command_names_wins_over_the_trees_git(monkeypatch):
    monkeypatch.delenv("VOXSERVE_COMMIT", raising=False)
    assert git_commit() != "0123abc"
    monkeypatch.setenv("VOXSERVE_COMMIT", "0123abc")
    assert git_commit() == "0123abc"
