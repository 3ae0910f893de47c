"""Where a profiled step's GPU time goes: `python -m benchmarks.trace_summary TRACE [--top 25]`.

TRACE is a Chrome trace from torch's profiler (`.json` or `.json.gz`, e.g. what vLLM writes under
`--profiler-config '{"profiler": "torch", "torch_profiler_dir": ...}'`, see benchmarks/gpu_host/profile_step.sh). Prints the
kernels with the most device time (summed over the trace), the device's busy share of the traced span (kernels and
copies merged over all streams), and the longest idle gaps between them.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load_events(path: str | Path) -> list[dict]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data["traceEvents"] if isinstance(data, dict) else data


def device_intervals(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, copy and memset."""
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("name", "?"))
                  for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES)


def per_stream(events: list[dict], top: int = 0) -> list[tuple[str, int, float, list[tuple[str, int, float]]]]:
    """(stream, launches, device us, its `top` kernels as (name, launches, us)) per stream, busiest first: the
    backbone's stream against the codec lanes'."""
    totals: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES:
            entry = totals[str(e.get("tid", "?"))][e.get("name", "?")]
            entry[0] += 1
            entry[1] += float(e.get("dur", 0))
    rows = []
    for tid, names in totals.items():
        kernels = sorted(((name, int(n), us) for name, (n, us) in names.items()), key=lambda k: -k[2])
        rows.append((tid, sum(k[1] for k in kernels), sum(k[2] for k in kernels), kernels[:top]))
    return sorted(rows, key=lambda t: -t[2])


def summarize(events: list[dict], top: int = 25, stream_top: int = 0) -> dict:
    intervals = device_intervals(events)
    if not intervals:
        return {"kernels": [], "span_us": 0.0, "busy_us": 0.0, "gaps_us": []}
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for start, end, name in intervals:
        per_name[name][0] += 1
        per_name[name][1] += end - start
    busy, gaps = 0.0, []
    cur_start, cur_end = intervals[0][0], intervals[0][1]
    for start, end, _ in intervals[1:]:  # merge overlapping intervals (several streams at once count once)
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    kernels = sorted(((name, int(n), total) for name, (n, total) in per_name.items()), key=lambda k: -k[2])
    return {"kernels": kernels[:top], "span_us": intervals[-1][1] - intervals[0][0], "busy_us": busy,
            "gaps_us": sorted(gaps, reverse=True)[:10], "gaps_over_100us": sum(g for g in gaps if g > 100),
            "streams": per_stream(events, stream_top)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--stream-top", type=int, default=0, help="also list each stream's busiest kernels")
    args = ap.parse_args(argv)
    s = summarize(load_events(args.trace), args.top, args.stream_top)
    span = s["span_us"] or 1.0
    print(f"span {span / 1e3:.1f} ms, device busy {s['busy_us'] / 1e3:.1f} ms ({100 * s['busy_us'] / span:.0f} %);"
          f" longest idle gaps (us): {', '.join(f'{g:.0f}' for g in s['gaps_us'])};"
          f" idle in gaps over 100 us: {s['gaps_over_100us'] / 1e3:.1f} ms")
    for tid, count, total, kernels in s["streams"]:
        print(f"stream {tid}: {total / 1e3:.2f} ms device time in {count} launches")
        for name, n, us in kernels:
            print(f"    {us / 1e3:9.2f} ms {n:7d}x  {name[:100]}")
    for name, count, total in s["kernels"]:
        print(f"{total / 1e3:9.2f} ms {count:7d}x  {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
