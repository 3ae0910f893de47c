import json
from pathlib import Path

import pytest

from benchmarks.headroom import format_report, headroom, main
from benchmarks.step_log import parse_line
from tests.benchmarks.synthetic_record import synthetic_record
from tests.benchmarks.test_step_log import engine_core_line
from vllm_voxserve.step_host_times import StepHostTimes

FRAMES_A_REQUEST = 62  # every synthetic request's


def _window(title: str, steps: int, each_step) -> str:
    lines, now = [], [0.0]
    timer = StepHostTimes(every=steps, report=lines.append, clock=lambda: now[0], every_s=1e9, title=title)
    for step in range(steps):
        now[0] += 0.010
        each_step(timer, step)
        timer.end_step()
    return lines[0]


def worker_line(stamp: str, frames: int, batches: int, waiting: int) -> str:
    """A worker's step-log line: `frames` backbone frames a step, `batches` background batches of 40 chunks."""
    def step(timer: StepHostTimes, i: int) -> None:
        timer.add("prepare", 0.0004)
        timer.add_count("backbone frames", frames)
        timer.add_gauge("chunks waiting for a lane", waiting)
        if i < batches:
            timer.add_batch("background lane", 40, 0.008, rows=64)
    return engine_core_line(_window("voxserve step host time", 10, step), f"12-07 {stamp}")


def scheduler_line(stamp: str, backbone: float, codec: float) -> str:
    def step(timer: StepHostTimes, i: int) -> None:
        timer.add("schedule", 0.001)
        timer.add_gauge("capacity backbone frames/s", backbone)
        timer.add_gauge("capacity codec frames/s", codec)
    return engine_core_line(_window("voxserve scheduler host time", 4, step), f"12-07 {stamp}")


def threads_line(stamp: str, share: int) -> str:
    return engine_core_line(f"voxserve threads, share of a CPU: MainThread (7) {share}% (preempted 0/s)",
                            f"12-07 {stamp}")


def start(rate_windows: dict[float, list[str]]) -> dict:
    """A record whose seeds at each rate started at the given UTC times of day (30 s windows)."""
    record = synthetic_record(sorted(rate_windows), seeds=(0, 1), window_s=30.0)
    for run in record["runs"]:
        run["started_at"] = f"2026-12-07T{rate_windows[run['rate']][run['seed']]}.250+00:00"
    return record


# Seeds of 8 req/s at 12:00:00 and 12:00:33; the lines of 12:00:00 and 12:00:33 still cover the idle time before them,
# and 12:00:50 is a line of 16 req/s's first seed.
LOG = [worker_line("12:00:00", 1, 0, 0), scheduler_line("12:00:00", 9000, 9000), threads_line("12:00:00", 5),
       worker_line("12:00:10", 30, 5, 40), scheduler_line("12:00:10", 2000, 1000), threads_line("12:00:10", 60),
       worker_line("12:00:20", 32, 5, 60), scheduler_line("12:00:20", 2200, 1100), threads_line("12:00:20", 70),
       worker_line("12:00:30", 34, 6, 80), scheduler_line("12:00:30", 2400, 1200), threads_line("12:00:30", 80),
       worker_line("12:00:33", 2, 0, 0), scheduler_line("12:00:33", 9000, 9000),
       worker_line("12:00:43", 31, 5, 50), scheduler_line("12:00:43", 2100, 1050),
       worker_line("12:00:53", 36, 6, 90), scheduler_line("12:00:53", 2300, 1150),
       worker_line("12:01:03", 33, 5, 70), scheduler_line("12:01:03", 2500, 1250),
       worker_line("12:01:20", 99, 9, 500), scheduler_line("12:01:20", 5000, 5000)]
RECORD = {8.0: ["12:00:00", "12:00:33"], 16.0: ["12:01:10", "12:01:43"]}


def rows() -> list[dict]:
    return [parse_line(line) for line in LOG]


def test_the_figures_come_from_the_lines_inside_the_rates_windows_only():
    fig = headroom(rows(), start(RECORD), rate=8.0, target=10.0)
    inside = [parse_line(line) for line in LOG if line.split()[4] in
              ("12:00:10", "12:00:20", "12:00:30", "12:00:43", "12:00:53", "12:01:03")]
    delivered = sorted(row["frames_per_s"] for row in inside if row["source"] == "step")
    assert fig["worker_lines"] == 6 and fig["scheduler_lines"] == 6
    assert fig["backbone_delivered"][1:] == (delivered[0], delivered[-1])
    assert fig["backbone_model"] == (2250.0, 2000.0, 2500.0) and fig["codec_model"] == (1125.0, 1000.0, 1250.0)
    assert fig["chunks_waiting"] == (65.0, 40.0, 90.0)
    assert fig["main_thread_share"] == (0.7, 0.6, 0.8)  # the threads lines of the first seed; none in the second
    assert fig["frames_per_request"] == FRAMES_A_REQUEST
    assert fig["needed_at_rate"] == 8 * FRAMES_A_REQUEST and fig["needed_at_target"] == 10 * FRAMES_A_REQUEST


def test_a_lanes_chunks_a_second_count_the_seconds_since_the_workers_line_before():
    fig = headroom(rows(), start(RECORD), rate=8.0, target=10.0)
    # 5, 5, 6 batches of 40 chunks in 10 s each (seed 0), and 5, 6, 5 after 10 s each (seed 1)
    assert fig["lanes"]["background"]["chunks_per_s"] == (20.0, 20.0, 24.0)
    assert fig["lanes"]["background"]["batch"] == (40.0, 40.0, 40.0)
    assert fig["lanes"]["background"]["rows"] == (64.0, 64.0, 64.0)
    assert fig["lanes"]["urgent"]["chunks_per_s"] is None


def test_the_report_sets_what_the_target_needs_beside_the_models_estimates():
    report = format_report(headroom(rows(), start(RECORD), rate=8.0, target=10.0))
    assert "62.0 frames a request: 496 frames/s at 8 req/s, 620 at 10" in report
    backbone = next(line for line in report.splitlines() if line.startswith("| backbone frames/s, the capacity"))
    codec = next(line for line in report.splitlines() if line.startswith("| codec frames/s, the capacity"))
    assert backbone.endswith(f"| {620 / 2250:.2f}× |") and codec.endswith(f"| {620 / 1125:.2f}× |")
    assert "2,250 (2,000-2,500)" in backbone


def files(tmp_path: Path, log_lines: list[str]) -> tuple[str, str]:
    """The server's log and the sweep's record as the command reads them."""
    log, record_file = tmp_path / "serve.log", tmp_path / "record.json"
    log.write_text("\n".join(log_lines) + "\n")
    record_file.write_text(json.dumps(start(RECORD)))
    return str(log), str(record_file)


def test_a_rate_the_record_lacks_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"no run at 12 req/s \(it has 8, 16\)"):
        headroom(rows(), start(RECORD), rate=12.0, target=20.0)
    log, record_file = files(tmp_path, LOG)
    with pytest.raises(SystemExit) as stop:
        main([log, record_file, "--rate", "12", "--target", "20"])
    assert stop.value.code == 2 and "no run at 12 req/s" in capsys.readouterr().err
    assert main([log, record_file, "--rate", "8", "--target", "10"]) == 0
    assert "6 worker and 6 scheduler lines inside the windows of 8 req/s" in capsys.readouterr().out


def test_a_log_of_another_start_is_refused(tmp_path, capsys):
    log, record_file = files(tmp_path, [worker_line("09:00:00", 30, 5, 40)])
    with pytest.raises(SystemExit):
        main([log, record_file, "--rate", "8", "--target", "10"])
    assert "no step-log line ended inside the windows of 8 req/s" in capsys.readouterr().err
