"""The served step log as a table: `python -m benchmarks.step_log SERVE_LOG [--json OUT] [--rows LOW-HIGH]`.

The worker logs one `voxserve step host time over N steps ...` line per window (`step_host_times.py`: every 2,000 steps
or 10 s). This prints one row per line, with the log's time of day so rows can be matched to a sweep's rates: steps,
mean decode batch, the backbone's frames per second, decode and prompt-carrying steps' device time (p50), the step
interval (p50/p90 and the window's longest, ms), the device's idle gap before a step (p50/p90: the host time it waited
for), our host time (p50 of the total), each codec lane's busy share and mean batch (and the mean batch size it ran at,
padding included, where the line has it), the gauges (open audio streams, chunks waiting for a lane: p50/max), and the
worker's part of the time to first audio of the requests that heard it in the window (prefill to first chunk cut:
p50/p99 ms, and in steps: p50/max, about the first chunk's frames where every step decoded it; cut to first audio sent:
p50/p99 ms), and the lanes pump's host time (p50/p99 of a step, and in parentheses its mean in ms a second of steps: the
median says how the work is spread over the steps, the rate how much there is). The scheduler's lines get their own
table: its host time, admitted streams, admission's capacity estimates and demand shares, how long arrivals took to
reach the engine (p50/p99 ms: the part of T spent before admission judged them) and to the step that scheduled their
prompt (p50/p99/max ms: the wait for a prefill besides), and its decisions by reason; the API server's cuts of its
in-progress limit (`edge_admission`), one row each, with what made them; and the API server's load (`server_load`: its
event loop's lag, its threads' CPU, its garbage collections and the first audios it handed on, p50/p99/max ms from
the route's entry). Each step-time line's longest step keeps its own parts in the raw log ("of it ...").
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
from pathlib import Path

_LINE = re.compile(r"(\d\d:\d\d:\d\d).*voxserve (step|scheduler) host time over (\d+) steps \(ms, p50/p90/p99\): (.*)$")
_THREADS = re.compile(r"(\d\d:\d\d:\d\d).*voxserve threads, share of a CPU: (.*)$")
_GC = re.compile(r"(\d\d:\d\d:\d\d).*voxserve gc collections: (.*)$")
_SERVER_LOAD = re.compile(r"(\d\d:\d\d:\d\d).*voxserve api server load: (.*)$")
_EDGE_CUT = re.compile(r"(\d\d:\d\d:\d\d).*voxserve edge admission: (in-progress limit cut .*)$")
_SPREAD = re.compile(r"^(?P<name>[a-z_ /%]+?) (?P<p50>[\d.]+)/(?P<p90>[\d.]+)/(?P<p99>[\d.]+)(?P<rest>.*)$")
_TALLY = re.compile(r"^admission (?P<reason>[a-z: -]+) (?P<n>\d+)$")  # the scheduler's admission decisions
_GAUGES = ("open audio streams", "chunks waiting for a lane", "first chunk ms after prefill",
           "first chunk steps after prefill", "first audio ms after cut", "prepare staging wait us",
           "prepare copies us", "lanes pump us", "lanes harvest us", "lanes deliver us", "lanes plan us",
           "lanes launch us", "lanes drain us",
           "admitted streams", "capacity backbone frames/s", "capacity codec frames/s", "step overhead ms",
           "demand % of backbone", "demand % of codec", "codebook0 draw us", "arrival age ms",
           "arrival to prefill ms")
_LANE = re.compile(r"^(?P<lane>\w+) lane (?P<n>\d+) batches of mean (?P<mean>[\d.]+)(?: run as (?P<rows>[\d.]+))?, "
                   r"device time (?P<p50>[\d.]+)/[\d.]+/[\d.]+, busy (?P<busy>\d+)%$")


def parse_line(text: str) -> dict | None:
    """One window of the step log (the worker's, or with `"source": "scheduler"` the policy's) as a dict, or None
    for any other log line."""
    threads = _THREADS.search(text)
    if threads is not None:  # the worker process's busy threads over the window that just ended
        return {"time": threads.group(1), "source": "threads", "threads": threads.group(2).strip()}
    load = _SERVER_LOAD.search(text)
    if load is not None:
        return {"time": load.group(1), "source": "api_server", "load": load.group(2).strip()}
    cut = _EDGE_CUT.search(text)
    if cut is not None:  # the API server's in-progress limit, cut
        return {"time": cut.group(1), "source": "edge", "cut": cut.group(2).strip()}
    collections = _GC.search(text)
    if collections is not None:  # and its garbage collections
        return {"time": collections.group(1), "source": "gc", "gc": collections.group(2).strip()}
    match = _LINE.search(text)
    if match is None:
        return None
    row: dict = {"time": match.group(1), "source": match.group(2), "steps": int(match.group(3))}
    for segment in match.group(4).split("; "):
        lane = _LANE.match(segment)
        if lane:
            row[f"{lane['lane']}_busy"] = int(lane["busy"]) / 100
            row[f"{lane['lane']}_batch"] = float(lane["mean"])
            row[f"{lane['lane']}_batches"] = int(lane["n"])
            if lane["rows"]:  # the rows it ran at: the mean batch padded up to the executables' batch sizes
                row[f"{lane['lane']}_rows"] = float(lane["rows"])
            continue
        tally = _TALLY.match(segment)
        if tally:
            row.setdefault("admission", {})[tally["reason"]] = int(tally["n"])
            continue
        spread = _SPREAD.match(segment)
        if spread is None:
            continue
        name, rest = spread["name"].strip(), spread["rest"]
        keys = ("p50", "p99", "max") if name in _GAUGES else ("p50", "p90", "p99")  # gauges: p50/p99/max
        row[name] = dict(zip(keys, (float(spread["p50"]), float(spread["p90"]), float(spread["p99"])), strict=True))
        longest = re.search(r"longest ([\d.]+) ending", rest)  # one blocked step, which no percentile shows
        if longest:
            row[name]["longest"] = float(longest.group(1))
        batch = re.search(r"at mean batch ([\d.]+)", rest)
        if batch:
            row["batch"] = float(batch.group(1))
        share = re.search(r"at mean (\d+) prompt tokens \((\d+)% of steps\)", rest)
        if share:
            row["prompt_tokens"], row["prefill_share"] = int(share.group(1)), int(share.group(2)) / 100
    frames = re.search(r"; backbone frames (\d+)/s", match.group(4))
    if frames:
        row["frames_per_s"] = int(frames.group(1))
    for name, key in (("lanes pump host us", "pump_us_per_s"), ("codebook0 draw host us", "draw_us_per_s")):
        rate = re.search(rf"; {name} (\d+)/s", match.group(4))  # host microseconds a second: the mean share
        if rate:
            row[key] = int(rate.group(1))
    return row


def parse_log(path: str | Path) -> list[dict]:
    """The step log's rows in a server's log, plain or xz-compressed (as the results keep them)."""
    rows = []
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt", errors="replace") as f:
        for text in f:
            row = parse_line(text)
            if row is not None:
                rows.append(row)
    return rows


def _cell(row: dict, name: str, key: str = "p50", scale: float = 1.0, digits: int = 1) -> str:
    value = row.get(name)
    if isinstance(value, dict):
        value = value.get(key)
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_table(rows: list[dict]) -> str:
    head = ("time      steps batch frames/s decode  prefill(share)  interval p50/p90/longest  gap p50/p90  host  "
            "urgent  background    streams  waiting  to cut   steps  to audio   pump us p50/p99 (ms/s)")
    lines = [head]
    scheduler = [r for r in rows if r.get("source") == "scheduler"]
    for r in rows:
        if r.get("source") in ("scheduler", "threads", "gc", "edge", "api_server"):
            continue
        prefill = f"{_cell(r, 'prefill step device time')}({_cell(r, 'prefill_share', scale=100, digits=0)}%)"
        lanes = (f"{_cell(r, 'urgent_busy', scale=100, digits=0):>3}%   "
                 f"{_cell(r, 'background_busy', scale=100, digits=0):>3}% x{_cell(r, 'background_batch')}"
                 + (f" as {_cell(r, 'background_rows')}" if "background_rows" in r else ""))
        gauges = (f"{_cell(r, 'open audio streams', digits=0)}/{_cell(r, 'open audio streams', 'max', digits=0)}  "
                  f"{_cell(r, 'chunks waiting for a lane', digits=0)}/"
                  f"{_cell(r, 'chunks waiting for a lane', 'max', digits=0)}  "
                  f"{_cell(r, 'first chunk ms after prefill', digits=0)}/"
                  f"{_cell(r, 'first chunk ms after prefill', 'p99', digits=0)}  "
                  f"{_cell(r, 'first chunk steps after prefill', digits=0)}/"
                  f"{_cell(r, 'first chunk steps after prefill', 'max', digits=0)}  "
                  f"{_cell(r, 'first audio ms after cut', digits=0)}/"
                  f"{_cell(r, 'first audio ms after cut', 'p99', digits=0)}")
        lines.append(f"{r['time']}  {r['steps']:5d} {_cell(r, 'batch'):>5} {_cell(r, 'frames_per_s', digits=0):>8} "
                     f"{_cell(r, 'decode device time'):>6}  "
                     f"{prefill:>14}  {_cell(r, 'step interval'):>7}/{_cell(r, 'step interval', 'p90')}/"
                     f"{_cell(r, 'step interval', 'longest', digits=0):<7}  "
                     f"{_cell(r, 'device gap before a step', digits=2):>5}/"
                     f"{_cell(r, 'device gap before a step', 'p90', digits=2):<5}  "
                     f"{_cell(r, 'total', digits=2):>4}  {lanes}  {gauges}  "
                     f"{_cell(r, 'lanes pump us', digits=0)}/{_cell(r, 'lanes pump us', 'p99', digits=0)}"
                     f" ({_cell(r, 'pump_us_per_s', scale=1e-3)})")
    if scheduler:  # the policy's own host time a step (schedule + update), in the same engine-core thread
        lines += ["", "time      steps  scheduler host ms p50/p90 (schedule, update, total)  admitted streams  "
                      "capacity frames/s backbone/codec  demand % backbone/codec max  arrival age ms p50/p99  "
                      "to prefill ms p50/p99/max  admission decisions"]
        for r in scheduler:
            parts = "  ".join(f"{_cell(r, n, digits=3)}/{_cell(r, n, 'p90', digits=3)}"
                              for n in ("schedule", "update", "total"))
            decisions = ", ".join(f"{reason} {n}" for reason, n in r.get("admission", {}).items()) or "-"
            lines.append(f"{r['time']}  {r['steps']:5d}  {parts}  {_cell(r, 'admitted streams', digits=0):>16}  "
                         f"{_cell(r, 'capacity backbone frames/s', digits=0):>15}/"
                         f"{_cell(r, 'capacity codec frames/s', digits=0):<16}  "
                         f"{_cell(r, 'demand % of backbone', 'max', digits=0):>13}/"
                         f"{_cell(r, 'demand % of codec', 'max', digits=0):<13}  "
                         f"{_cell(r, 'arrival age ms', digits=0):>11}/"
                         f"{_cell(r, 'arrival age ms', 'p99', digits=0):<10}  "
                         f"{_cell(r, 'arrival to prefill ms', digits=0):>9}/"
                         f"{_cell(r, 'arrival to prefill ms', 'p99', digits=0)}/"
                         f"{_cell(r, 'arrival to prefill ms', 'max', digits=0):<8}  "
                         f"{decisions}")
    cuts = [r for r in rows if r.get("source") == "edge"]
    if cuts:  # refusals at the API server: the engine's table does not see them
        lines += ["", "time      the API server's in-progress limit"]
        lines += [f"{r['time']}  {r['cut']}" for r in cuts]
    loads = [r for r in rows if r.get("source") == "api_server"]
    if loads:  # the time a response's audio waits in the API server, which the engine's tables do not see
        lines += ["", "time      the API server's load"]
        lines += [f"{r['time']}  {r['load']}" for r in loads]
    threads = [r for r in rows if r.get("source") == "threads"]
    if threads:  # who else took the CPU in the worker's process (GIL contenders of the step loop)
        lines += ["", "time      busy threads of the worker's process (share of one CPU); the machine's CPUs"]
        lines += [f"{r['time']}  {r['threads']}" for r in threads]
    collections = [r for r in rows if r.get("source") == "gc"]
    if collections:  # each stops every thread of the process, the step loop included
        lines += ["", "time      garbage collections in the worker's process (count, total and longest pause)"]
        lines += [f"{r['time']}  {r['gc']}" for r in collections]
    return "\n".join(lines)


# What `--rows` spans over the windows of a band of decode rows: (heading, row key, percentile, scale, digits)
_BAND_COLUMNS = (
    ("frames/s", "frames_per_s", None, 1.0, 0),
    ("step interval p50 ms", "step interval", "p50", 1.0, 1),
    ("device gap p50 ms", "device gap before a step", "p50", 1.0, 2),
    ("host p50 ms", "total", "p50", 1.0, 2),
    ("background batch", "background_batch", None, 1.0, 1),
    ("background batch run as", "background_rows", None, 1.0, 1),
    ("chunks waiting p50", "chunks waiting for a lane", "p50", 1.0, 0),
    ("pump p50 us a step", "lanes pump us", "p50", 1.0, 0),
    ("pump ms a second", "pump_us_per_s", None, 1e-3, 1),
)


def band_summary(rows: list[dict], low: float, high: float) -> str:
    """Each column's range (lowest-highest) over the worker's windows whose mean decode batch is in [low, high]: the
    same load on two starts compared, whatever the rate that brought it."""
    band = [r for r in rows if r.get("source") == "step" and r.get("batch") is not None and low <= r["batch"] <= high]
    lines = [f"{len(band)} windows at {low:g}-{high:g} decode rows"]
    for heading, key, percentile, scale, digits in _BAND_COLUMNS:
        values = [v.get(percentile) if isinstance(v, dict) else v for v in (r.get(key) for r in band)]
        values = [v * scale for v in values if v is not None]
        span = f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "-"
        lines.append(f"  {heading:<22} {span}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--rows", metavar="LOW-HIGH", help="instead of the table: each column's range over the windows "
                    "whose mean decode batch is in LOW-HIGH")
    args = ap.parse_args(argv)
    rows = parse_log(args.log)
    if args.rows:
        low, _, high = args.rows.partition("-")
        print(band_summary(rows, float(low), float(high)))
    else:
        print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
