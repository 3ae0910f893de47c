"""The protocol's report from synthetic sweep records whose requests' fates are set by rate, seed and arrival."""

import json
from pathlib import Path

import pytest

from benchmarks.cli import main as cli_main
from benchmarks.metrics import SloSpec
from benchmarks.protocol import REFUSAL_SOURCES, Capacity, held_on_every_start, summarize_protocol
from benchmarks.protocol_report import main
from benchmarks.record import main as record_main, slim_record
from tests.benchmarks.fake_speech_server import FakeBehavior, FakeSpeechServer
from tests.benchmarks.synthetic_record import FAIL, LATE, ON_TIME, REJECT, STALL, synthetic_record

RATES = [24.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0]
PNGS = ("attainment.png", "ttfa_p99.png", "goodput.png")


def collapsing_server(rate, seed, position):
    """On time up to 40 req/s; at 48 the last 5 % of each window late (a queue growing); then refusals and
    failures."""
    if rate <= 40:
        return ON_TIME
    if rate == 48:
        return LATE if position >= 0.95 else ON_TIME
    if rate == 56:
        return REJECT if position < 0.5 else ON_TIME
    if rate == 64:
        return REJECT if seed == 0 else ON_TIME
    return FAIL if position < 0.25 else STALL if position >= 0.75 else ON_TIME


def write(tmp_path, name, record):
    (tmp_path / name).mkdir()
    (tmp_path / name / "record.json").write_text(json.dumps(record))
    return str(tmp_path / name)


def test_capacity_stability_and_goodput_at_multiples_of_capacity():
    record = synthetic_record(RATES, window_s=6.0, fate=collapsing_server)
    summary = summarize_protocol("ours", record["runs"], SloSpec())
    rows = {row.rate: row for row in summary.rows}
    assert [row.rate for row in summary.rows] == RATES and all(row.seeds == (0, 1, 2) for row in summary.rows)
    assert all(rows[r].pooled.attainment == 1.0 for r in (24, 32, 40))
    assert 0.9 <= rows[48].pooled.attainment < 0.99 and rows[48].last_third < rows[48].first_third == 1.0
    assert (summary.capacity["0.99"].rate, summary.capacity["0.90"].rate) == (40, 48)
    assert not summary.capacity["0.99"].lower_bound
    assert summary.unstable_rates == (48,)  # up to the 90 % capacity, only 48 drifts
    assert rows[56].refused_share == pytest.approx(1 - rows[56].pooled.attainment) and rows[56].failed_share == 0
    assert rows[56].refusal_p99_s == pytest.approx(0.003, abs=0.002) and rows[40].refusal_p99_s is None
    assert rows[64].attainment_per_seed == (0.0, 1.0, 1.0) and rows[64].pooled.ttfa_p99_s < 0.2  # admitted ones
    assert 0.2 < rows[80].failed_share < 0.3 and rows[80].pooled.num_stalled > 0
    assert [(g.multiple, g.rate) for g in summary.goodput_at] == [(1.5, 64), (2.0, 80)]  # 60 lies between 56 and 64
    at_two = summary.goodput_at[1]
    assert at_two.goodput == pytest.approx(rows[80].pooled.num_met / 18)
    assert at_two.share_of_capacity == pytest.approx(at_two.goodput / 40)


def test_report_of_two_starts_and_a_baseline_full_and_slimmed(tmp_path, capsys):
    fast = synthetic_record(RATES, window_s=6.0, fate=collapsing_server)
    stock = synthetic_record(RATES[:3], window_s=6.0, fate=lambda rate, seed, position: LATE if rate > 24 else ON_TIME,
                             server="stock")
    dirs = [write(tmp_path, "start1", fast), write(tmp_path, "start2", slim_record(json.loads(json.dumps(fast)))),
            write(tmp_path, "stock", stock)]
    (tmp_path / "start1" / "host.json").write_text(json.dumps({"python_per_s": 56428.07}))  # `benchmarks.host_speed`
    (tmp_path / "stock" / "host.json").write_text(json.dumps({"python_per_s": 45196.2}))
    (tmp_path / "stock" / "host_after_sweep.json").write_text(json.dumps({"python_per_s": 24969.7}))  # protocol.sh
    out = tmp_path / "report"
    assert main([*dirs, "--labels", "ours 1", "ours 2", "stock", "--baseline", "stock", "--out", str(out)]) == 0
    table = (out / "protocol.md").read_text()
    assert "| ours 1 | 48 | 40 | " in table and "| stock | 0 | 0 |" not in table and "| stock | 24 | 24 |" in table
    hosts = {line.split(" | ")[0][2:]: line.split(" | ")[-2] for line in table.splitlines() if line.startswith("| ")}
    assert hosts["ours 1"] == "56,428" and hosts["ours 2"] == "n/a"  # read beside the start whose folder keeps it
    assert hosts["stock"] == "45,196 (24,970 after its sweep)"
    assert "1.7×" in table and "off by > 1 point at 48" in table and "#### ours 2" in table
    full, slim, base = json.loads((out / "protocol.json").read_text())["entries"]
    assert [e["label"] for e in (full, slim, base)] == ["ours 1", "ours 2", "stock"]
    assert (full["host_python_per_s"], slim["host_python_per_s"]) == (56428.07, None)
    assert (full["host_after_sweep_python_per_s"], base["host_after_sweep_python_per_s"]) == (None, 24969.7)
    assert full["capacity"] == slim["capacity"] == {"0.90": {"rate": 48, "lower_bound": False, "below": None},
                                                    "0.99": {"rate": 40, "lower_bound": False, "below": None}}
    for a, b in zip(full["rates"], slim["rates"]):  # a slimmed record gives the same figures, TTFA to 0.1 ms
        assert (a["attainment"], a["num_stalled"], a["third_drift_points"]) == \
               (b["attainment"], b["num_stalled"], b["third_drift_points"])
        assert a["ttfa_p99_admitted_s"] == pytest.approx(b["ttfa_p99_admitted_s"], abs=1e-4)
    for png in PNGS:
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_a_capacity_no_probed_rate_missed_is_a_lower_bound(tmp_path):
    record = synthetic_record([8.0, 16.0], window_s=6.0, fate=lambda rate, seed, position: ON_TIME)
    out = tmp_path / "report"
    assert main([write(tmp_path, "r", record), "--out", str(out)]) == 0
    assert "| ours | ≥ 16 | ≥ 16 |" in (out / "protocol.md").read_text()
    (entry,) = json.loads((out / "protocol.json").read_text())["entries"]
    assert entry["capacity"]["0.99"] == {"rate": 16, "lower_bound": True, "below": None}
    assert entry["goodput_at_capacity_multiples"] == []


def test_a_capacity_under_the_lowest_probed_rate_says_so(tmp_path):
    """The lowest probed rate already misses 99 %: the capacity is under it, not zero, and so is its multiple of the
    baseline's."""
    ours = synthetic_record([80.0, 88.0], window_s=6.0,
                            fate=lambda rate, seed, position: REJECT if seed == 0 and position < 0.1 else ON_TIME)
    stock = synthetic_record([24.0, 32.0], window_s=6.0,
                             fate=lambda rate, seed, position: LATE if rate > 24 else ON_TIME, server="stock")
    out = tmp_path / "report"
    assert main([write(tmp_path, "ours", ours), write(tmp_path, "stock", stock), "--labels", "ours", "stock",
                 "--baseline", "stock", "--out", str(out)]) == 0
    table = (out / "protocol.md").read_text()
    assert "| ours | ≥ 88 | < 80 | n/a | not probed | off by > 1 point at 80, 88 | < 3.3× |" in table
    entry = json.loads((out / "protocol.json").read_text())["entries"][0]
    assert entry["capacity"]["0.99"] == {"rate": 0, "lower_bound": False, "below": 80}


def test_a_record_of_modes_gives_one_entry_per_mode_and_labels_must_differ(tmp_path):
    one = synthetic_record([8.0], window_s=4.0, fate=lambda rate, seed, position: ON_TIME)
    record = {**one, "modes": {"lanes": {"runs": one["runs"]}, "vllm-stock": {"runs": one["runs"]}}}
    folder = write(tmp_path, "modes", record)
    out = tmp_path / "report"
    assert main([folder, "--labels", "start 1", "--out", str(out)]) == 0
    labels = [e["label"] for e in json.loads((out / "protocol.json").read_text())["entries"]]
    assert labels == ["start 1 lanes", "start 1 vllm-stock"]
    with pytest.raises(SystemExit, match="share a label"):
        main([write(tmp_path, "a", one), write(tmp_path, "b", one), "--out", str(out)])


def level(concurrency, p50):
    return {"concurrency": concurrency, "num_requests": 64, "num_completed": 63, "num_rejected": 0, "num_failed": 1,
            "num_met": 60, "wall_s": 10.0, "ttfa_p50_s": p50, "ttfa_p95_s": 2 * p50, "ttfa_p99_s": 3 * p50,
            "ttfa_mean_s": p50, "rtf_p50": 0.2, "rtf_mean": 0.25, "audio_s_per_wall_s": 40.0, "requests_per_s": 6.3}


def test_a_closed_loop_record_adds_a_table_of_ttfa_per_level(tmp_path):
    closed = {"kind": "concurrency", "server": "vllm-omni", "commit": "0123abcdef", "strategy": "concurrency",
              "levels": [level(1, 0.3), level(32, 8.4)], "runs": []}
    sweep = synthetic_record([8.0], window_s=4.0, fate=lambda rate, seed, position: ON_TIME)
    out = tmp_path / "report"
    assert main([write(tmp_path, "sweep", sweep), write(tmp_path, "closed", closed), "--out", str(out)]) == 0
    table = (out / "protocol.md").read_text()
    assert "| ours | ≥ 8 | ≥ 8 |" in table
    assert "| vllm-omni | 1 | 300 ms | 600 ms | 900 ms | 0.250 | 40.0 | 63/64 | 60/64 | 0123abc |" in table
    assert "| vllm-omni | 32 | 8400 ms | 16800 ms |" in table
    report = json.loads((out / "protocol.json").read_text())
    assert [e["label"] for e in report["entries"]] == ["ours"]
    assert [lv["concurrency"] for lv in report["concurrency"][0]["levels"]] == [1, 32]
    only = tmp_path / "only"
    assert main([str(tmp_path / "closed"), "--out", str(only)]) == 0  # a closed-loop record alone: no rate plots
    assert (only / "protocol.md").read_text().startswith("TTFA with a fixed number") and not (only / PNGS[0]).exists()
    # the levels of one server's closed-loop records, run in two parts, join into one table
    later = {**closed, "levels": [level(8, 1.0)]}
    joined = tmp_path / "joined"
    assert main([f"{tmp_path / 'closed'}+{write(tmp_path, 'later', later)}", "--out", str(joined)]) == 0
    assert [lv["concurrency"] for lv in json.loads((joined / "protocol.json").read_text())["concurrency"][0]["levels"]] \
        == [1, 32, 8]


def test_a_record_slimmed_before_chunks_were_kept_is_refused_by_name(tmp_path):
    record = synthetic_record([8.0], window_s=4.0, fate=lambda rate, seed, position: ON_TIME)
    for run in record["runs"]:
        for request in run["requests"]:
            request["first_audio_s"] = request.pop("chunk_times_s")[0]
            request["num_chunks"] = len(request.pop("chunk_audio_bytes"))
    folder = write(tmp_path, "old", record)
    with pytest.raises(SystemExit, match=f"{folder}: .*slimmed without chunk times"):
        main([folder, "--out", str(tmp_path / "report")])


@pytest.mark.slow
def test_a_sweep_against_the_fake_server_reports_the_same_from_its_full_and_its_slimmed_record(tmp_path):
    """The report recomputes what the sweep measured: stalls, refusals and attainment per rate, also once slimmed."""
    workload = tmp_path / "texts.txt"
    workload.write_text("plain words\na STALL here\nREJECT it\nanother plain one\n")
    full_dir = tmp_path / "full"
    with FakeSpeechServer(FakeBehavior(header_gap_s=0.01)) as server:
        assert cli_main(["sweep", "--base-url", server.base_url, "--workload", str(workload), "--rates", "4,8",
                         "--window-s", "2", "--seeds", "0,1", "--warmup", "0", "--response-format", "wav",
                         "--stop-fraction", "0", "--out", str(full_dir), "--no-progress"]) == 0
    assert record_main(["--slim", str(full_dir), str(tmp_path / "slim")]) == 0
    out = tmp_path / "report"
    assert main([str(full_dir), str(tmp_path / "slim"), "--labels", "full", "slim", "--out", str(out)]) == 0
    full, slim = json.loads((out / "protocol.json").read_text())["entries"]
    measured = json.loads((full_dir / "record.json").read_text())["summaries"]
    for rate, a, b in zip(measured, full["rates"], slim["rates"]):
        assert rate["num_stalled"] == a["num_stalled"] == b["num_stalled"] > 0
        assert rate["attainment"] == a["attainment"] == b["attainment"]
        assert a["refused_share"] == b["refused_share"] == rate["num_rejected"] / rate["num_requests"] > 0


def test_a_sweep_and_its_overload_rates_join_into_one_entry(tmp_path):
    sweep = synthetic_record(RATES[:4], window_s=6.0, fate=collapsing_server)
    overload = synthetic_record([60.0, 80.0], seeds=(0,), window_s=6.0, fate=collapsing_server, rng_seed=1)
    out = tmp_path / "report"
    (tmp_path / "overload.json").write_text(json.dumps(overload))
    joined = write(tmp_path, "sweep", sweep) + "+" + str(tmp_path / "overload.json")
    assert main([joined, "--labels", "defaults", "--out", str(out)]) == 0
    (entry,) = json.loads((out / "protocol.json").read_text())["entries"]
    assert [r["rate"] for r in entry["rates"]] == [24, 32, 40, 48, 60, 80] and entry["rates"][-1]["seeds"] == [0]
    assert [(g["multiple"], g["rate"]) for g in entry["goodput_at_capacity_multiples"]] == [(1.5, 60), (2.0, 80)]
    with pytest.raises(SystemExit, match="two runs of 24 req/s with seed 0"):
        main([joined + "+" + str(tmp_path / "sweep"), "--out", str(out)])


def answered(request, message, after_s):
    return {**request, "error": json.dumps({"error": {"message": message, "code": 503}}),
            "finished_s": request["sent_s"] + after_s}


def test_refusals_are_grouped_by_where_the_server_decided_them_with_their_answer_times(tmp_path):
    """Refusals at arrival are to be answered within 50 ms, a request held and then shed later: the report keeps
    them apart by the answer's wording, and the limits' refusals apart from the load's, and counts any other refusal
    as such."""
    record = synthetic_record([40.0], seeds=(0,), window_s=6.0, fate=lambda rate, seed, position: REJECT)
    requests = record["runs"][0]["requests"]
    kinds = [("server at capacity: 140 requests in progress at this API server, the most ...", 0.002,
              "API server at arrival: its limit"),
             ("server at capacity: 150 requests in progress at this API server, as many as when the engine ...",
              0.003, "API server at arrival: the engine's limit"),
             ("server at capacity: 150 requests in progress, the most it has lately kept ...", 0.090,
              "engine core at arrival: its limit"),
             ("server at capacity: first audio predicted 205 ms after arrival (target 200 ms)", 0.040,
              "engine core at arrival: the load"),
             ("could not start audio within 200 ms under current load", 0.150, "engine core, held then shed"),
             ("overloaded", 0.010, "other")]
    record["runs"][0]["requests"] = [answered(r, *kinds[i % len(kinds)][:2]) for i, r in enumerate(requests)]
    out = tmp_path / "report"
    assert main([write(tmp_path, "sweep", record), "--labels", "ours", "--out", str(out)]) == 0
    (rate,) = json.loads((out / "protocol.json").read_text())["entries"][0]["rates"]
    by_source = {r["source"]: r for r in rate["refusals_by_source"]}
    assert list(by_source) == [source for source, _ in REFUSAL_SOURCES] + ["other"]
    assert sum(r["count"] for r in by_source.values()) == len(requests)
    assert by_source["API server at arrival: its limit"]["count"] == len(range(0, len(requests), len(kinds)))
    for _, after_s, source in kinds:
        assert by_source[source]["p50_s"] == pytest.approx(after_s, abs=1e-6)
        assert by_source[source]["p99_s"] == pytest.approx(after_s, abs=1e-6)
    text = (out / "protocol.md").read_text()
    assert "| 40 | engine core at arrival: its limit | " in text and "| 90 ms | 90 ms | 90 ms |" in text


def test_the_refusal_sources_match_the_plugins_wording():
    """The words the report tells refusals apart by are those the plugin answers with."""
    root = Path(__file__).resolve().parents[2] / "vllm_voxserve"
    sources = {"API server at arrival: its limit": root / "entrypoints" / "edge_admission.py",
               "API server at arrival: the engine's limit": root / "entrypoints" / "speech_service.py",
               "engine core, held then shed": root / "scheduler" / "overload.py",
               "engine core at arrival: its limit": root / "scheduler" / "overload.py",
               "engine core at arrival: the load": root / "scheduler" / "overload.py"}
    for source, words in REFUSAL_SOURCES:
        assert words in sources[source].read_text(), (source, words)


def test_late_first_audios_are_counted_with_the_seconds_they_bunched_in(tmp_path):
    """Late first audios sent within one second of each window count once a second per seed; refusals, failures and
    stalls with first audio in time are not late."""
    band = (0.5, 0.65)  # of a 6 s window: sent from 3.0 to 3.9 s, all within its fourth second

    def fate(rate, seed, position):
        if rate == 24:
            return STALL if position < 0.2 else REJECT if position > 0.8 else ON_TIME
        return LATE if band[0] <= position < band[1] else FAIL if position > 0.9 else ON_TIME

    record = synthetic_record([24.0, 40.0], window_s=6.0, fate=fate)
    quiet, bunched = summarize_protocol("ours", record["runs"], SloSpec()).rows
    assert quiet.late_first_audio is None
    late_by_seed = [sum(band[0] <= r["scheduled_s"] / 6.0 < band[1] for r in run["requests"])
                    for run in record["runs"] if run["rate"] == 40]
    late = bunched.late_first_audio
    assert late.count == sum(late_by_seed) and late.seconds == 3 and late.most_in_one_second == max(late_by_seed)
    assert 0.25 <= late.ttfa_p50_s <= late.ttfa_max_s <= 0.6 + 0.003
    out = tmp_path / "report"
    assert main([write(tmp_path, "sweep", record), "--labels", "ours", "--out", str(out)]) == 0
    text = (out / "protocol.md").read_text()
    assert "first audio came late" in text and f"| 40 | {late.count} | " in text and "| 24 | 0 |" not in text
    rates = json.loads((out / "protocol.json").read_text())["entries"][0]["rates"]
    assert rates[0]["late_first_audio"] is None and rates[1]["late_first_audio"]["seconds"] == 3


def test_late_first_audios_awaited_across_a_pause_of_the_client_are_told_apart(tmp_path):
    """A request sent 20 ms or more after its schedule marks a pause of the load client; late first audios awaited
    across one are counted, those awaited outside any are not."""
    band = (0.5, 0.55)  # of a 6 s window: late ones sent from 3.0 to 3.3 s

    def fate(rate, seed, position):
        return LATE if band[0] <= position < band[1] else ON_TIME

    record = synthetic_record([40.0], seeds=(0,), window_s=6.0, fate=fate)
    (run,) = record["runs"]
    first_late = min((r for r in run["requests"] if band[0] <= r["scheduled_s"] / 6.0 < band[1]),
                     key=lambda r: r["sent_s"])

    def paused_at(start_s):  # the run with one more request, sent 40 ms after its schedule at start_s
        pause = {**run["requests"][0], "index": 10_000, "scheduled_s": start_s, "sent_s": start_s + 0.04}
        return [{**run, "requests": run["requests"] + [pause]}]

    def late_of(runs):
        (row,) = summarize_protocol("ours", runs, SloSpec()).rows
        return row.late_first_audio

    quiet = late_of(paused_at(0.5))  # long before any late request was sent
    runs = paused_at(first_late["sent_s"] + 0.01)
    across = late_of(runs)
    assert quiet.count == across.count > 0 and quiet.while_client_paused == 0
    assert 1 <= across.while_client_paused <= across.count
    out = tmp_path / "report"
    assert main([write(tmp_path, "sweep", {**record, "runs": runs}), "--labels", "ours", "--out", str(out)]) == 0
    text = (out / "protocol.md").read_text()
    assert "while the client paused" in text and f"| {across.count} | " in text
    assert text.split("| 40 | ")[-1].rstrip().endswith(f"| {across.while_client_paused} |")


@pytest.mark.parametrize("capacities, held", [
    ([Capacity(112, False), Capacity(88, False)], Capacity(88, False)),
    ([Capacity(112, False), Capacity(88, True)], Capacity(88, True)),  # the second ran out of rates at 88
    ([Capacity(88, False), Capacity(96, True)], Capacity(88, False)),
    ([Capacity(88, True), Capacity(88, False)], Capacity(88, False)),  # one start missed just above 88
    ([Capacity(112, False), Capacity(0, False, below=56)], Capacity(0, False, below=56)),
])
def test_what_every_start_held_is_the_lowest_and_exact_where_one_missed_just_above_it(capacities, held):
    assert held_on_every_start(capacities) == held


def test_the_report_says_what_every_named_start_held_beside_the_baseline(tmp_path):
    fast = synthetic_record(RATES, window_s=6.0, fate=collapsing_server)
    slow = synthetic_record(RATES[:4], window_s=6.0, fate=lambda rate, seed, position: LATE if rate > 32 else ON_TIME)
    stock = synthetic_record(RATES[:3], window_s=6.0, fate=lambda rate, seed, position: LATE if rate > 24 else ON_TIME,
                             server="stock")
    dirs = [write(tmp_path, "start1", fast), write(tmp_path, "start2", slow), write(tmp_path, "stock", stock)]
    out = tmp_path / "report"
    assert main([*dirs, "--labels", "s1", "s2", "stock", "--baseline", "stock", "--starts", "s1", "s2",
                 "--out", str(out)]) == 0
    assert "Held on every start of s1, s2: 32 req/s at 90 %, 32 req/s at 99 % (1.3× stock at 99 %)." in \
        (out / "protocol.md").read_text()
    held = json.loads((out / "protocol.json").read_text())["held_on_every_start"]
    assert held == {"labels": ["s1", "s2"], "capacity": {"0.90": {"rate": 32, "lower_bound": False, "below": None},
                                                         "0.99": {"rate": 32, "lower_bound": False, "below": None}}}
    with pytest.raises(SystemExit, match="name no entry"):
        main([*dirs, "--labels", "s1", "s2", "stock", "--starts", "s1", "s3", "--out", str(out)])
