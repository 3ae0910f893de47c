import lzma

import pytest

from benchmarks.step_log import _BAND_COLUMNS, band_summary, format_table, main, parse_line
from vllm_voxserve.step_host_times import StepHostTimes


def engine_core_line(message: str, stamp: str = "12-01 01:10:00", where: str = "step_timing.py:105") -> str:
    """`message` as the engine core process's logger prints it."""
    return f"(EngineCore pid=1) INFO {stamp} [{where}] {message}"


def scheduler_window(every: int) -> tuple[StepHostTimes, list[str]]:
    """The scheduler's host-time window and the lines it logs."""
    lines: list[str] = []
    return StepHostTimes(every=every, report=lines.append, title="voxserve scheduler host time"), lines


def test_a_logged_window_round_trips_into_a_row():
    lines, now = [], [0.0]
    timer = StepHostTimes(every=4, report=lines.append, clock=lambda: now[0])
    timer.add_device_step("decode", 8, 0.004)
    timer.add_device_step("prefill", 120, 0.012)
    timer.add_batch("urgent lane", 2, 0.003)
    timer.add_batch("background lane", 13, 0.020, rows=16)
    for step in range(4):
        now[0] += 0.010
        timer.add("prepare", 0.0004)
        timer.add_gauge("open audio streams", 10 + step)
        timer.add_gauge("chunks waiting for a lane", step)
        timer.add_gauge("first chunk ms after prefill", 40.0 + step)
        timer.add_gauge("first chunk steps after prefill", 5 if step else 12)
        timer.add_gauge("first audio ms after cut", 2.5)
        timer.add_count("backbone frames", 8)
        timer.add_gauge("lanes pump us", 900 if step == 3 else 100)
        timer.add_count("lanes pump host us", 900 if step == 3 else 100)
        timer.end_step()
    row = parse_line(engine_core_line(lines[0], "11-30 17:04:10", "step_timing.py:72"))
    assert row["time"] == "17:04:10" and row["steps"] == 4 and row["batch"] == 8.0
    assert row["decode device time"]["p50"] == 4.0 and row["prefill step device time"]["p50"] == 12.0
    assert row["prompt_tokens"] == 120 and row["prefill_share"] == 0.5
    assert row["step interval"]["p50"] == 10.0 and row["total"]["p50"] == 0.4
    # 23 ms of lane work over 30 ms of step intervals (the first step has no interval)
    assert row["urgent_busy"] == 0.1 and row["background_busy"] == 0.67 and row["background_batch"] == 13.0
    assert row["background_rows"] == 16.0 and "urgent_rows" not in row  # the rows it ran at, where logged
    assert row["urgent_batches"] == 1 and row["background_batches"] == 1
    assert row["open audio streams"]["max"] == 13.0 and row["chunks waiting for a lane"]["max"] == 3.0
    assert row["first chunk ms after prefill"] == {"p50": 42.0, "p99": 43.0, "max": 43.0}
    assert row["first audio ms after cut"]["p50"] == 2.5
    assert (row["first chunk steps after prefill"]["p50"], row["first chunk steps after prefill"]["max"]) == (5, 12)
    assert row["frames_per_s"] == 1067  # 32 frames over 30 ms of step intervals
    # the pump's median step and its mean: 1,200 us over 30 ms of step intervals is 40 ms a second
    assert row["lanes pump us"]["p50"] == 100 and row["pump_us_per_s"] == 40000
    table = format_table([row])
    assert table.splitlines()[1].split()[3] == "1067" and " x13.0 as 16.0  " in table.splitlines()[1]
    assert "17:04:10" in table.splitlines()[1]
    assert table.splitlines()[1].endswith("42/43  5/12  2/2  100/900 (40.0)")


def test_the_windows_longest_step_interval_is_parsed_and_shown_beside_its_percentiles():
    lines, now = [], [0.0]
    timer = StepHostTimes(every=200, report=lines.append, clock=lambda: now[0], every_s=1e9)
    for step in range(200):
        now[0] += 1.25 if step == 100 else 0.012  # one blocked step: its percentiles stay at 12 ms
        timer.add("prepare", 0.0004)
        timer.end_step()
    row = parse_line(engine_core_line(lines[0], "12-06 11:58:30", "step_host_times.py:126"))
    assert row["step interval"] == {"p50": 12.0, "p90": 12.0, "p99": 12.0, "longest": 1250.0}
    assert " 12.0/12.0/1250  " in format_table([row]).splitlines()[1]


def test_the_schedulers_window_gets_its_own_table():
    timer, lines = scheduler_window(every=2)
    for streams in (3, 5):
        timer.add("schedule", 0.0002)
        timer.add("update", 0.0003)
        timer.add_gauge("admitted streams", streams)
        timer.end_step()
    row = parse_line(engine_core_line(lines[0]))
    assert row["source"] == "scheduler" and row["total"]["p50"] == 0.5 and row["admitted streams"]["max"] == 5.0
    table = format_table([row]).splitlines()
    assert len(table) == 4 and table[-1].startswith("01:10:00      2  0.200/0.200  0.300/0.300  0.500/0.500")


def test_the_schedulers_admission_estimates_and_decisions_are_parsed():
    timer, lines = scheduler_window(every=2)
    for codec in (14000, 13000):
        timer.add("schedule", 0.0002)
        timer.add_gauge("capacity backbone frames/s", 21000)
        timer.add_gauge("capacity codec frames/s", codec)
        timer.add_gauge("demand % of codec", 85)
        timer.add_tally("admission accepted", 7)
        timer.add_tally("admission refused: codec frames", 2)
        timer.end_step()
    row = parse_line(engine_core_line(lines[0]))
    assert row["capacity codec frames/s"]["max"] == 14000 and row["demand % of codec"]["p50"] == 85
    assert row["admission"] == {"accepted": 14, "refused: codec frames": 4}
    last = format_table([row]).splitlines()[-1]
    assert "21000/" in last and "accepted 14, refused: codec frames 4" in last


@pytest.mark.parametrize("gauge, values, spread, header, cell", [
    # how long arrivals took to reach the engine
    ("arrival age ms", (12.5, 48.0), {"p50": 12.5, "p99": 48.0, "max": 48.0}, "arrival age ms p50/p99", "12/48"),
    # and to the step that scheduled their prompt
    ("arrival to prefill ms", (20.0, 31.0, 95.0), {"p50": 31.0, "p99": 95.0, "max": 95.0},
     "to prefill ms p50/p99/max", "31/95/95"),
])
def test_the_arrivals_times_are_columns_of_the_schedulers_table(gauge, values, spread, header, cell):
    timer, lines = scheduler_window(every=len(values))
    for ms in values:
        timer.add("schedule", 0.0002)
        timer.add_gauge(gauge, ms)
        timer.end_step()
    row = parse_line(engine_core_line(lines[0]))
    assert row[gauge] == spread
    table = format_table([row]).splitlines()
    assert header in table[-2] and cell in table[-1].split()


def test_every_admission_reason_the_scheduler_logs_is_tallied():
    from vllm_voxserve.scheduler import overload

    reasons = (overload.ACCEPTED, overload.REFUSED_BACKBONE, overload.REFUSED_CODEC, overload.REFUSED_FIRST_AUDIO,
               overload.REFUSED_LIMIT, overload.SHED_WAITING)
    timer, lines = scheduler_window(every=1)
    timer.add("schedule", 0.0002)
    for n, reason in enumerate(reasons, start=1):
        timer.add_tally(f"admission {reason}", n)
    timer.end_step()
    row = parse_line(engine_core_line(lines[0], "12-03 01:10:00"))
    assert row["admission"] == {reason: n for n, reason in enumerate(reasons, start=1)}


def test_other_log_lines_are_not_rows():
    assert parse_line("(APIServer pid=871) INFO 11-30 17:04:50 [loggers.py:310] Engine 000: Running: 97 reqs") is None


def test_the_worker_threads_line_gets_its_own_table():
    line = ("(EngineCore pid=1) INFO 12-01 05:00:10 [runtime.py:140] voxserve threads, share of a CPU: "
            "MainThread (7) 96%, EngineCoreOutputThread (9) 31%; machine: 5.2 of 16 CPUs busy, 0.4 % stolen")
    row = parse_line(line)
    threads = "MainThread (7) 96%, EngineCoreOutputThread (9) 31%; machine: 5.2 of 16 CPUs busy, 0.4 % stolen"
    assert row == {"time": "05:00:10", "source": "threads", "threads": threads}
    table = format_table([row]).splitlines()
    assert table[-1] == f"05:00:10  {threads}" and "the machine's CPUs" in table[-2] and len(table) == 4


def test_the_gc_line_gets_its_own_table():
    row = parse_line("(EngineCore pid=1) INFO 12-01 05:00:10 [runtime.py:141] voxserve gc collections: "
                     "gen0 40 (1.2 ms total, max 0.08 ms); gen2 1 (9.5 ms total, max 9.50 ms)")
    assert row["source"] == "gc" and row["gc"].endswith("max 9.50 ms)")
    assert format_table([row]).splitlines()[-1].startswith("05:00:10  gen0 40 (1.2 ms total")


def test_the_api_servers_limit_cuts_get_their_own_table(caplog):
    import logging

    from vllm_voxserve.entrypoints.edge_admission import EdgeGuard
    from vllm_voxserve.scheduler.concurrency_limit import LimitSettings

    guard = EdgeGuard(LimitSettings(0.2, 16), retry_after_s=1.0)
    for ticket in [guard.admit(-2.0 + i / 100) for i in range(20)]:  # a busy server: the load below is no burst
        ticket.first_audio(ticket.arrival_time + 0.1)  # onto an idle one, whose first audios are no evidence
    tickets = [guard.admit(i / 100) for i in range(50)]
    for ticket in tickets:
        ticket.first_audio(ticket.arrival_time + 0.3)  # every first audio late
    with caplog.at_level(logging.INFO, logger="vllm_voxserve.entrypoints.edge_admission"):
        guard.admit(0.56)
    # the guard's own log line, as vLLM's API server prefixes it
    line = f"(APIServer pid=1) INFO 12-04 11:11:33 [edge_admission.py:112] {caplog.records[0].getMessage()}"
    row = parse_line(line)
    assert row == {"time": "11:11:33", "source": "edge",
                   "cut": "in-progress limit cut to 63 at 70 in progress (late: 50 of 50 first audios)"}
    assert format_table([row]).splitlines()[-1] == f"11:11:33  {row['cut']}"


def test_the_api_servers_load_gets_its_own_table():
    line = ("(APIServer pid=1) INFO 12-04 11:17:28 [server_load.py:50] voxserve api server load: event loop lag ms "
            "p50/p99/max 0.2/35.0/120.4 over 180 ticks; threads, share of a CPU: MainThread (1) 97%; first audio "
            "handed on ms p50/p99/max 120.3/190.2/231.0 over 1012 requests")
    row = parse_line(line)
    assert row["source"] == "api_server" and row["load"].startswith("event loop lag ms p50/p99/max 0.2/35.0/120.4")
    assert row["load"].endswith("first audio handed on ms p50/p99/max 120.3/190.2/231.0 over 1012 requests")
    assert format_table([row]).splitlines()[-1] == f"11:17:28  {row['load']}"


def worker_window(batch: float, frames: int, gap_p50: float, pump_p50: int) -> str:
    """A worker's window as the step log prints it, with the columns `--rows` spans."""
    return engine_core_line(
        "voxserve step host time over 800 steps (ms, p50/p90/p99): total 1.666/4.169/6.463; step interval "
        f"11.896/16.751/20.598; decode device time 11.040/12.190/13.167 at mean batch {batch}; device gap before a "
        f"step {gap_p50}/0.420/0.564; background lane 253 batches of mean 38.0, device time 46.899/50.039/52.003, "
        f"busy 97%; chunks waiting for a lane 16/52/58; lanes pump us {pump_p50}/4899/7169; backbone frames "
        f"{frames}/s; lanes pump host us 86053/s", where="step_host_times.py:126")


def test_rows_spans_each_column_over_the_windows_of_a_band_of_decode_rows(tmp_path, capsys):
    log = tmp_path / "serve.log.xz"  # the results keep server logs xz-compressed
    with lzma.open(log, "wt") as f:
        f.write("\n".join([worker_window(130.0, 9000, 0.3, 500), worker_window(60.0, 5000, 9.0, 4000),
                           worker_window(147.5, 10500, 0.25, 700), "(APIServer pid=2) INFO unrelated"]) + "\n")
    assert main([str(log), "--rows", "125-150"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 windows at 125-150 decode rows"  # the window at 60 rows is outside the band
    spans = {line[:25].strip(): line[25:].strip() for line in out[1:]}
    assert spans["frames/s"] == "9000-10500"
    assert spans["device gap p50 ms"] == "0.25-0.30"
    assert spans["pump p50 us a step"] == "500-700"
    assert spans["pump ms a second"] == "86.1-86.1"
    assert spans["background batch"] == "38.0-38.0" and spans["chunks waiting p50"] == "16-16"


def test_rows_names_a_band_with_no_windows():
    assert band_summary([], 10, 20).splitlines() == ["0 windows at 10-20 decode rows"] + [
        f"  {heading:<22} -" for heading, *_ in _BAND_COLUMNS]
