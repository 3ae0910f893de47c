"""What stands between a measured rate and a target one, from one server start's log and its sweep record:
`python -m benchmarks.headroom SERVE_LOG RECORD --rate R --target T`.

The record gives the workload's frames a request (its mean over every request) and when each seed of rate R ran; the
step log's lines (`benchmarks.step_log`) that ended inside those windows, at least one line's length after a window's
start so that no idle gap between windows counts, give what the server did at R: the backbone's frames a second
delivered and the scheduler's capacity model for the backbone and the codec (its estimates from measured step and batch
times), each codec lane's busy share, batch and chunks a second (batches x mean batch over the seconds between the
lane's log lines), the chunks left waiting for a lane, the host time of a step and the worker process's main thread's
share of a CPU. Each figure is the lines' p50 with their range; the table then sets the frames a second that T needs
beside the model's estimates. The log's times of day are compared with the record's in UTC: the server must log in UTC.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.record import read_record
from benchmarks.step_log import parse_log

LINE_S = 10.0  # a step-log line covers at most this many seconds (`step_host_times`: 10 s or 2,000 steps)
_MAIN_THREAD = re.compile(r"MainThread \(\d+\) (\d+)%")
_DAY_S = 24 * 3600


def _second_of_day(stamp: str) -> float:
    hours, minutes, seconds = (int(part) for part in stamp.split(":"))
    return hours * 3600 + minutes * 60 + seconds


def frames_per_request(record: dict[str, Any]) -> float:
    frames = [request["num_frames"] for run in record["runs"] for request in run["requests"]]
    if not frames:
        raise ValueError("the record holds no request")
    return sum(frames) / len(frames)


def rate_windows(record: dict[str, Any], rate: float) -> list[tuple[float, float]]:
    """(start, end) of each seed's window at `rate`, in seconds of the UTC day."""
    windows = []
    for run in record["runs"]:
        if abs(run["rate"] - rate) > 1e-9:
            continue
        started = datetime.fromisoformat(run["started_at"])
        start = started.hour * 3600 + started.minute * 60 + started.second + started.microsecond / 1e6
        windows.append((start, start + run["window_s"]))
    if not windows:
        rates = sorted({run["rate"] for run in record["runs"]})
        raise ValueError(f"the record has no run at {rate:g} req/s (it has {', '.join(f'{r:g}' for r in rates)})")
    return windows


def lines_within(rows: Sequence[dict], windows: Sequence[tuple[float, float]], source: str) -> list[dict]:
    """The log's lines of `source` that ended inside a window and began after its start (a line covers up to
    `LINE_S` seconds before it)."""
    def inside(row: dict) -> bool:
        t = _second_of_day(row["time"])
        # a stamp is the whole second it fell in: a line may have ended up to 1 s after it
        return any(start + LINE_S <= t + offset + 1 and t + offset <= end + 1
                   for start, end in windows for offset in (0, _DAY_S))
    return [row for row in rows if row.get("source") == source and inside(row)]


def lane_chunks_per_s(every_line: Sequence[dict], chosen: Sequence[dict], lane: str) -> list[float]:
    """Chunks a second through `lane` in each chosen worker line, over the seconds since the worker's line before it."""
    chosen_ids = {id(row) for row in chosen}
    rates = []
    for before, row in zip(every_line, every_line[1:]):
        seconds = (_second_of_day(row["time"]) - _second_of_day(before["time"])) % _DAY_S
        if id(row) in chosen_ids and f"{lane}_batches" in row and 0 < seconds <= LINE_S + 1:
            rates.append(row[f"{lane}_batches"] * row[f"{lane}_batch"] / seconds)
    return rates


def _spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def _p50s(rows: Sequence[dict], name: str) -> list[float]:
    return [row[name]["p50"] for row in rows if isinstance(row.get(name), dict)]


def headroom(rows: Sequence[dict], record: dict[str, Any], rate: float, target: float) -> dict[str, Any]:
    """The figures of the module's table: at `rate` from the log, and what `target` needs."""
    windows = rate_windows(record, rate)
    worker = lines_within(rows, windows, "step")
    scheduler = lines_within(rows, windows, "scheduler")
    threads = lines_within(rows, windows, "threads")
    every_worker_line = [row for row in rows if row.get("source") == "step"]
    per_request = frames_per_request(record)
    return {
        "rate": rate, "target": target, "frames_per_request": per_request,
        "needed_at_rate": rate * per_request, "needed_at_target": target * per_request,
        "worker_lines": len(worker), "scheduler_lines": len(scheduler),
        "backbone_delivered": _spread([row.get("frames_per_s") for row in worker]),
        "backbone_model": _spread(_p50s(scheduler, "capacity backbone frames/s")),
        "codec_model": _spread(_p50s(scheduler, "capacity codec frames/s")),
        "lanes": {lane: {"busy": _spread([row.get(f"{lane}_busy") for row in worker]),
                         "batch": _spread([row.get(f"{lane}_batch") for row in worker]),
                         "rows": _spread([row.get(f"{lane}_rows") for row in worker]),
                         "chunks_per_s": _spread(lane_chunks_per_s(every_worker_line, worker, lane))}
                  for lane in ("urgent", "background")},
        "chunks_waiting": _spread([row["chunks waiting for a lane"]["max"] for row in worker
                                   if isinstance(row.get("chunks waiting for a lane"), dict)]),
        "worker_host_ms": _spread(_p50s(worker, "total")),
        "scheduler_host_ms": _spread(_p50s(scheduler, "total")),
        "step_interval_ms": _spread(_p50s(worker, "step interval")),
        "device_gap_ms": _spread(_p50s(worker, "device gap before a step")),
        "main_thread_share": _spread([int(m.group(1)) / 100 for row in threads
                                      if (m := _MAIN_THREAD.search(row.get("threads", "")))]),
    }


def _cell(spread: tuple[float, float, float] | None, digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    if spread is None:
        return "-"
    p50, low, high = (v * scale for v in spread)
    return f"{p50:,.{digits}f}{unit} ({low:,.{digits}f}-{high:,.{digits}f})"


def format_report(fig: dict[str, Any]) -> str:
    rate, target = f"{fig['rate']:g}", f"{fig['target']:g}"
    need = fig["needed_at_target"]

    def times(model: tuple[float, float, float] | None) -> str:
        return f"{need / model[0]:.2f}×" if model else "-"

    lines = [f"{fig['frames_per_request']:.1f} frames a request: {fig['needed_at_rate']:,.0f} frames/s at {rate} "
             f"req/s, {need:,.0f} at {target}; {fig['worker_lines']} worker and {fig['scheduler_lines']} scheduler "
             f"lines inside the windows of {rate} req/s (p50 of the lines, lowest-highest)", "",
             f"| | at {rate} req/s | {target} req/s needs | × the model's estimate |", "|---|---|---|---|",
             f"| backbone frames/s delivered | {_cell(fig['backbone_delivered'])} | {need:,.0f} | |",
             f"| backbone frames/s, the capacity model | {_cell(fig['backbone_model'])} | {need:,.0f} | "
             f"{times(fig['backbone_model'])} |",
             f"| codec frames/s, the capacity model | {_cell(fig['codec_model'])} | {need:,.0f} | "
             f"{times(fig['codec_model'])} |"]
    for lane, values in fig["lanes"].items():
        lines.append(f"| {lane} lane: busy; chunks a batch (rows run); chunks/s | "
                     f"{_cell(values['busy'], 0, 100, ' %')}; {_cell(values['batch'], 1)} "
                     f"({_cell(values['rows'], 1)}); {_cell(values['chunks_per_s'])} | | |")
    lines += [f"| chunks waiting for a lane, each line's max | {_cell(fig['chunks_waiting'])} | | |",
              f"| host ms a step: the worker's, the scheduler's | {_cell(fig['worker_host_ms'], 2)}; "
              f"{_cell(fig['scheduler_host_ms'], 2)} | | |",
              f"| step interval ms; the device's gap before a step | {_cell(fig['step_interval_ms'], 1)}; "
              f"{_cell(fig['device_gap_ms'], 2)} | | |",
              f"| the worker process's main thread, share of a CPU | {_cell(fig['main_thread_share'], 0, 100, ' %')} "
              f"| | |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="the server's log (plain or .xz), as the results keep it")
    ap.add_argument("record", help="the sweep's record: a results folder or a record file")
    ap.add_argument("--rate", type=float, required=True, help="the measured rate (req/s) whose windows to read")
    ap.add_argument("--target", type=float, required=True, help="the rate (req/s) to set beside it")
    args = ap.parse_args(argv)
    try:
        fig = headroom(parse_log(Path(args.log)), read_record(args.record), args.rate, args.target)
    except ValueError as error:
        ap.error(str(error))
    if not fig["worker_lines"]:
        ap.error(f"no step-log line ended inside the windows of {args.rate:g} req/s: is this the start's log?")
    print(format_report(fig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
