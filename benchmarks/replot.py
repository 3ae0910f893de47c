"""Draw the plots of a finished run from its record.json: `python -m benchmarks.replot [--out DIR] DIR[=LABEL] ...`.

For runs made where matplotlib is missing (the offline GPU host). Several runs are drawn together (into --out, else
the first DIR); `=LABEL` names a plain search or sweep's series (its record's server name otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.metrics import RateSummary
from benchmarks.plots import plot_series
from benchmarks.record import read_record


def series_of(record: dict) -> dict[str, list[RateSummary]]:
    if "modes" in record:
        return {mode: [RateSummary(**s) for s in body["summaries"]] for mode, body in record["modes"].items()}
    return {record["server"]: [RateSummary(**s) for s in record["summaries"]]}


def main(argv: list[str]) -> int:
    out = None
    if argv[:1] == ["--out"]:
        out, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    series: dict[str, list[RateSummary]] = {}
    target_s = 0.2
    for arg in argv:
        folder, _, label = arg.partition("=")
        record = read_record(folder)
        found = series_of(record)
        if label:
            if len(found) != 1:
                raise SystemExit(f"{folder}: a label names one series, this record has {sorted(found)}")
            found = {label: next(iter(found.values()))}
        series.update(found)
        target_s = record.get("config", {}).get("load", {}).get("slo", {}).get("ttfa_target_s", target_s)
    target_dir = out or argv[0].partition("=")[0]
    Path(target_dir).mkdir(parents=True, exist_ok=True)
    for path in plot_series(series, target_dir, target_s):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
