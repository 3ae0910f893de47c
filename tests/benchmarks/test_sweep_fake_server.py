"""Short sweeps, searches and an ablation against the in-process fake server (loopback only)."""

import json
import re

import pytest

from benchmarks.cli import main
from benchmarks.client import make_profile
from benchmarks.sweep import LoadConfig, LoadGenerator, SweepConfig, requests_in_server, run_sweep
from benchmarks.workload import poisson_arrivals
from benchmarks.capacity_search import SearchConfig, run_search
from benchmarks.metrics import CANCELLED, COMPLETED, FAILED, REJECTED
from tests.benchmarks.fake_speech_server import FakeBehavior, FakeSpeechServer

pytestmark = pytest.mark.slow
TEXTS = ["the quick brown fox", "a short one", "REJECT this request", "please FAIL now", "a STALL in the middle",
         "a JSONERR reply"]
MARKERS = ("REJECT", "FAIL", "STALL", "JSONERR")
PNGS = ("attainment.png", "ttfa_p99.png", "goodput.png")


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def run_cli(capsys, *args, rc=0):
    assert main([*args, "--no-progress"]) == rc
    return capsys.readouterr().out.strip().splitlines()


def check_outputs(out_dir):
    record = json.loads((out_dir / "record.json").read_text())
    for png in PNGS:
        data = (out_dir / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    return record


def test_short_sweep_writes_record_and_plots(tmp_path, workload, capsys):
    out = tmp_path / "sweep"
    behavior = FakeBehavior(header_gap_s=0.08)
    with FakeSpeechServer(behavior) as server:
        lines = run_cli(capsys, "sweep", "--base-url", server.base_url, "--workload", workload, "--rates", "4,8",
                        "--window-s", "3", "--warmup", "4", "--response-format", "wav", "--fixed-length",
                        "--stop-fraction", "0.2",  # half the texts are meant to fail
                        "--model", "tiny", "--out", str(out))
    record = check_outputs(out)
    assert len(lines) == 1 and lines[0].startswith("ours: SLO capacity") and lines[0] in record["summary"]
    assert record["server"] == "ours" and record["model"] == "tiny" and "sweep" in record["command"]
    assert "commit" in record and record["machine"]["hostname"] and record["machine"]["cpu"]
    assert record["config"]["load"]["window_s"] == 3 and record["stop_reason"] == "all rates run"
    assert [s["rate"] for s in record["summaries"]] == [4, 8]
    # The warm-up burst was sent but is not in the record.
    assert len(server.payloads) == 4 + sum(len(run["requests"]) for run in record["runs"])
    assert all(p["max_new_tokens"] == round(len(p["input"].split()) * 5.2) + 1 for p in server.payloads)

    for run, summary in zip(record["runs"], record["summaries"]):
        requests = run["requests"]
        assert len(requests) == summary["num_requests"] > 3
        assert run["max_send_lag_s"] < 0.25  # arrivals kept to the absolute schedule
        by_kind = {word: [r for r in requests if word in r["text"]] for word in MARKERS}
        assert all(r["outcome"] == REJECTED and r["status"] == 503 and r["retry_after"] == "1"
                   for r in by_kind["REJECT"])
        assert all(r["outcome"] == FAILED and r["status"] == 500 for r in by_kind["FAIL"])
        assert all(r["outcome"] == FAILED and r["status"] == 200 and "bad voice" in r["error"]
                   for r in by_kind["JSONERR"])
        assert summary["num_rejected"] == len(by_kind["REJECT"])
        assert summary["num_failed"] == len(by_kind["FAIL"]) + len(by_kind["JSONERR"])
        assert summary["num_stalled"] == len(by_kind["STALL"]) > 0
        normal = [r for r in requests if not any(w in r["text"] for w in MARKERS)]
        for r in normal:
            assert r["outcome"] == COMPLETED and r["header_bytes"] == 44 and r["bytes_per_second"] == 48000
            assert r["chunk_audio_bytes"][0] == 0  # the header arrived alone ...
            first_audio = r["chunk_times_s"][1] - r["sent_s"]
            assert first_audio >= 0.08 + 0.02  # ... and TTFA waited for the PCM after it
        assert summary["num_met"] <= len(normal)
        assert summary["ttfa_p99_s"] >= 0.1


def test_sweep_stops_after_an_overloaded_rate(tmp_path, workload, capsys):
    out = tmp_path / "stop"
    with FakeSpeechServer(FakeBehavior(modes={"fast": 1.2})) as server:
        run_cli(capsys, "sweep", "--base-url", server.base_url, "--workload", workload, "--rates", "3,6,9",
                "--window-s", "2", "--warmup", "0", "--out", str(out))
    record = check_outputs(out)
    assert [s["rate"] for s in record["summaries"]] == [3]
    assert record["stop_reason"].startswith("stopped after 3 req/s")
    assert record["summaries"][0]["attainment"] == 0.0
    # The slow server did not slow the arrivals: every planned request was sent on time.
    (run,) = record["runs"]
    assert len(run["requests"]) == len(poisson_arrivals(3, 2, 0)) and run["max_send_lag_s"] < 0.25


def test_sweep_runs_two_rates_past_the_first_failure_then_stops(tmp_path, workload, capsys):
    out = tmp_path / "protocol"
    with FakeSpeechServer(FakeBehavior(modes={"fast": 0.5})) as server:  # first audio after 500 ms: every rate fails
        assert main(["sweep", "--base-url", server.base_url, "--workload", workload, "--rates", "2,4,6,8,10",
                     "--window-s", "1", "--warmup", "0", "--stop-fraction", "0", "--beyond-failure", "2",
                     "--out", str(out), "--no-progress"]) == 0
    record = check_outputs(out)
    assert [s["rate"] for s in record["summaries"]] == [2, 4, 6]
    # each rate's line is on stderr as it ends, progress bars or not (a sweep in the background shows how far it got)
    rate_lines = [line for line in capsys.readouterr().err.splitlines() if "req/s: attainment" in line]
    assert [line.split()[0] for line in rate_lines] == ["2", "4", "6"]
    assert record["stop_reason"] == "stopped 2 rate(s) after the first below 99% (2 req/s)"


def test_time_budget_stops_the_sweep_and_partial_records_are_saved(tmp_path, workload):
    seen = []
    with FakeSpeechServer() as server:
        load = LoadConfig(base_url=server.base_url, profile=make_profile("ours"), workload_path=workload,
                          window_s=1.5, warmup_requests=0, time_budget_s=2.5, progress=False)
        result = run_sweep(SweepConfig(load=load, rates=(2, 4, 6)), on_update=lambda r: seen.append(len(r.summaries)))
    assert [s.rate for s in result.summaries] == [2] and seen == [1]
    assert result.stop_reason.startswith("time budget of 2.5 s reached before 4 req/s")


def test_capacity_search_with_short_windows(tmp_path, capsys):
    path = tmp_path / "ok.txt"
    path.write_text("plain text one\nplain text two\n")
    out = tmp_path / "search"
    with FakeSpeechServer() as server:
        lines = run_cli(capsys, "search", "--base-url", server.base_url, "--workload", str(path), "--window-s", "2",
                        "--allow-short-window", "--start-rate", "4", "--max-rate", "8", "--warmup", "2",
                        "--out", str(out))
    record = check_outputs(out)
    assert record["strategy"] == "search" and record["window_s"] == 2
    assert record["probe_order"] == [4, 8]
    assert record["capacity"] == {"0.99": 8, "0.90": 8}
    assert ">=8 req/s at 90%" in lines[0]  # no probe missed: a lower bound


def test_search_reports_each_capacity_as_it_settles(tmp_path):
    """Partial saves see every settled capacity, also one settled from earlier probes (no probe follows it)."""
    path = tmp_path / "ok.txt"
    path.write_text("plain text one\nplain text two\n")
    seen = []
    with FakeSpeechServer() as server:
        load = LoadConfig(base_url=server.base_url, profile=make_profile("ours"), workload_path=str(path),
                          window_s=2, warmup_requests=0, progress=False)
        run_search(SearchConfig(load=load, start_rate=4, max_rate=8, resolution=4, allow_short_window=True),
                   warm_up=False, on_update=lambda r: seen.append(dict(r.capacity)))
    assert seen[-1] == {"0.99": 8, "0.90": 8} and len(seen) == 4  # two probes, then each threshold


def test_ablation_switches_modes_over_http(tmp_path, workload, capsys):
    out = tmp_path / "ablation"
    with FakeSpeechServer() as server:
        lines = run_cli(capsys, "ablation", "--base-url", server.base_url, "--workload", workload,
                        "--modes", "fast,slow", "--strategy", "sweep", "--rates", "4", "--window-s", "2",
                        "--warmup", "2", "--out", str(out))
        final_mode = server.mode
    record = check_outputs(out)
    assert final_mode == "slow" and record["switcher"] == "HttpModeSwitcher"
    assert list(record["modes"]) == ["fast", "slow"] and len(lines) == 2
    fast, slow = (record["modes"][m]["summaries"][0] for m in ("fast", "slow"))
    assert fast["num_met"] > 0 and slow["num_met"] == 0  # slow mode's first audio comes after 400 ms
    assert slow["ttfa_p50_s"] >= 0.4 > fast["ttfa_p50_s"]


def test_ablation_skips_a_mode_it_cannot_switch_to_and_measures_the_rest(tmp_path, workload, capsys):
    out = tmp_path / "ablation"
    behavior = FakeBehavior(modes={"fast": 0.02, "lanes": 0.02, "slow": 0.4}, broken_modes=("lanes",))
    with FakeSpeechServer(behavior) as server:
        lines = run_cli(capsys, "ablation", "--base-url", server.base_url, "--workload", workload,
                        "--modes", "fast,lanes,slow", "--strategy", "sweep", "--rates", "4", "--window-s", "2",
                        "--warmup", "2", "--out", str(out), rc=1)
        final_mode = server.mode
    record = check_outputs(out)
    assert final_mode == "slow" and list(record["modes"]) == ["fast", "slow"]
    assert list(record["mode_switch_errors"]) == ["lanes"] and "HTTP 500" in record["mode_switch_errors"]["lanes"]
    assert lines[-1].startswith("lanes: not measured: switching to 'lanes' failed")


def test_search_probe_settles_early_once_sure_to_miss(tmp_path, workload):
    with FakeSpeechServer(FakeBehavior(modes={"fast": 0.5})) as server:
        load = LoadConfig(base_url=server.base_url, profile=make_profile("ours"), workload_path=workload,
                          window_s=4, warmup_requests=0, progress=False)
        config = SearchConfig(load=load, start_rate=8, resolution=8, max_rate=8, allow_short_window=True)
        result = run_search(config)
    (run,) = result.runs
    assert run.settled_early and run.elapsed_s < 2.5  # instead of the 4 s window plus drain
    outcomes = {r.outcome for r in run.records}
    assert CANCELLED in outcomes and result.capacity == {"0.99": 0.0, "0.90": 0.0}
    assert result.summaries[0].num_requests == len(poisson_arrivals(8, 4, 0))  # unsent ones are counted too


@pytest.mark.parametrize("metrics", [True, False])
def test_a_window_waits_for_the_server_to_drain_first(tmp_path, workload, metrics):
    """A probe cut short leaves cancelled requests draining in the server: the next window starts once vLLM's
    gauges show none running or waiting (and at once where a server has no gauges)."""
    with FakeSpeechServer(FakeBehavior(metrics=metrics)) as server:
        server.drain_for(1.0)
        load = LoadConfig(base_url=server.base_url, profile=make_profile("ours"), workload_path=workload,
                          window_s=1, warmup_requests=0, progress=False)
        result = run_sweep(SweepConfig(load=load, rates=(2.0,)))
    (run,) = result.runs
    if metrics:
        assert 0.8 <= run.idle_wait_s < 3.0 and run.to_json()["idle_wait_s"] == run.idle_wait_s
    else:
        assert run.idle_wait_s is None


def test_requests_in_server_sums_vllms_gauges():
    page = ('# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0\n'
            'vllm:num_preemptions_total{engine="0"} 9.0\n')
    assert requests_in_server(page) == 5
    assert requests_in_server("process_cpu_seconds_total 1.0\n") is None


def test_a_window_runs_with_the_earlier_records_frozen_out_of_the_collector(tmp_path, workload):
    """The sweep's kept records stay out of the garbage collector's walks while a window sends (a full collection
    over them pauses the client's one event loop); afterwards the process's collector is as it was, and the
    window's longest collection is in its record."""
    import gc

    frozen_at_send = []

    class Recording(LoadGenerator):
        async def _send(self, record, origin, seed):
            frozen_at_send.append(gc.get_freeze_count())
            return await super()._send(record, origin, seed)

    kept = [[object()] for _ in range(1000)]  # earlier windows' records, as far as the collector can tell
    gc.unfreeze()
    with FakeSpeechServer() as server:
        load = LoadConfig(base_url=server.base_url, profile=make_profile("ours"), workload_path=workload,
                          window_s=1.5, warmup_requests=0, progress=False)
        result = run_sweep(SweepConfig(load=load, rates=(4.0,)), make_generator=Recording)
    assert frozen_at_send and min(frozen_at_send) >= len(kept)
    assert gc.get_freeze_count() == 0
    (run,) = result.runs
    assert 0.0 <= run.to_json()["client_gc_longest_s"] < 1.0
    # its start to the millisecond, so that started_at plus a send's offset meets the server log's lines
    started = run.to_json()["started_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", started), started
