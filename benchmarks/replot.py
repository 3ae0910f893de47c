"""Draw the plots of a finished run from its record.json: `python -m benchmarks.replot DIR [DIR ...]`.

For runs made where matplotlib is missing (the offline GPU host); several DIRs are drawn into the first one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.metrics import RateSummary
from benchmarks.plots import plot_series


def series_of(record: dict) -> dict[str, list[RateSummary]]:
    if "modes" in record:
        return {mode: [RateSummary(**s) for s in body["summaries"]] for mode, body in record["modes"].items()}
    return {record["server"]: [RateSummary(**s) for s in record["summaries"]]}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    series: dict[str, list[RateSummary]] = {}
    target_s = 0.2
    for folder in argv:
        record = json.loads((Path(folder) / "record.json").read_text())
        series.update(series_of(record))
        target_s = record.get("config", {}).get("load", {}).get("slo", {}).get("ttfa_target_s", target_s)
    for path in plot_series(series, argv[0], target_s):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
