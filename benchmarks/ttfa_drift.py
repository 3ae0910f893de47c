"""TTFA over the course of each probe: `python -m benchmarks.ttfa_drift RUN_DIR [--bin-s 2] [--mode M] [--rate R]`.

A rate a server can sustain keeps its TTFA level through a window; past what it can sustain a queue grows, and the
TTFA of later arrivals climbs. For every (mode, rate, seed) run of a record (full or slimmed), one line: the median
TTFA of the requests due in each `--bin-s` bin of the window, and how many of them got no audio (a run ended early
cancels the rest, sent or not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from benchmarks.record import first_audio_s, read_record


def drift(requests: list[dict[str, Any]], window_s: float, bin_s: float) -> list[tuple[float | None, int, int]]:
    """Per bin of scheduled sending time: (median TTFA in seconds or None, requests, requests without audio, those
    never sent included)."""
    bins: list[list[float]] = [[] for _ in range(max(1, round(window_s / bin_s)))]
    counts = [[0, 0] for _ in bins]
    for request in requests:
        index = min(int(request["scheduled_s"] // bin_s), len(bins) - 1)
        first = first_audio_s(request)
        counts[index][0] += 1
        if first is None or request.get("sent_s") is None:
            counts[index][1] += 1
        else:
            bins[index].append(first - request["sent_s"])
    return [(statistics.median(b) if b else None, n, missing) for b, (n, missing) in zip(bins, counts)]


def runs_of(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    bodies = record["modes"].items() if "modes" in record else [(record.get("server", "run"), record)]
    return [(mode, run) for mode, body in bodies for run in body.get("runs", [])]


def format_line(mode: str, run: dict[str, Any], bins: list[tuple[float | None, int, int]]) -> str:
    ended = ", ended early" if run.get("settled_early") else ""
    medians = " ".join("-" if m is None else f"{m * 1e3:.0f}" for m, _, _ in bins)
    missing = " ".join(str(missing) for _, _, missing in bins)
    return (f"{mode} {run['rate']:g} req/s seed {run['seed']} ({run.get('elapsed_s', 0):.1f} s{ended}): "
            f"TTFA p50 ms per bin {medians}; no audio {missing}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ttfa_drift", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a results folder with record.json (or .xz / .gz)")
    parser.add_argument("--bin-s", type=float, default=2.0)
    parser.add_argument("--mode", help="only this mode")
    parser.add_argument("--rate", type=float, help="only this rate (req/s)")
    args = parser.parse_args(argv)
    for mode, run in runs_of(read_record(args.run_dir)):
        if (args.mode and mode != args.mode) or (args.rate is not None and run["rate"] != args.rate):
            continue
        print(format_line(mode, run, drift(run["requests"], run["window_s"], args.bin_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
