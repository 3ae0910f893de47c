"""The measurement protocol's report from sweep records: `python -m benchmarks.protocol_report RECORD
[RECORD ...] [--labels LABEL ...] [--baseline LABEL] [--starts LABEL ...] --out DIR`, RECORD a results folder or
a record file.

Each record (one server start; a record of several modes gives one entry per mode; RECORD+RECORD joins the runs of
records of one server start, e.g. its sweep and its overload rates) is recomputed from its requests
(full or slimmed records): per rate, over its seeds, attainment pooled and per seed, p99 TTFA of admitted requests,
goodput, shares refused (429/503) and failed, stalls, attainment in the first vs the last third of each window;
capacity at 90 % and 99 %; goodput at 1.5x and 2x the 99 % capacity where probed; refusals by where the server
decided them and for what (at arrival by the API server's own limit or for the engine's, or by the engine core's
limit or for the load; or held then shed) with their answer times; admitted
requests whose first audio came late, with how they bunched in time (seconds with any, most in one second); the
host's single-thread speed where the start's folder keeps it (`host.json`, `host_speed_of`); with `--starts`, what
every named start of one served code held (the protocol's figure reproduced on a second start). Writes
DIR/protocol.md (tables to paste in a results README), DIR/protocol.json and attainment / p99 TTFA / goodput plots,
one line per entry. A closed-loop record (`python -m benchmarks concurrency`) adds a table of TTFA per number of
requests in flight.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.metrics import SloSpec, attainment_percent
from benchmarks.protocol import (
    CLIENT_PAUSE_S, Capacity, ProtocolSummary, RateRow, held_on_every_start, summarize_protocol,
)
from benchmarks.record import read_record


@dataclass(frozen=True, slots=True)
class Entry:
    """One server start and mode: its runs and where they came from."""

    label: str
    source: str
    record: dict[str, Any]
    mode: str | None
    runs: list[dict[str, Any]]
    slo: SloSpec
    host_python_per_s: float | None = None  # the host's speed on one thread (`host_speed_of`), where kept
    host_after_python_per_s: float | None = None  # the same once its sweep had ended (`host_after_sweep.json`)


def slo_of(record: dict[str, Any]) -> SloSpec:
    """The SLO a record was judged by (a plain run's load, or an ablation's sweep or search load)."""
    config = record.get("config") or {}
    for load in (config.get("load"), (config.get("sweep") or {}).get("load"), (config.get("search") or {}).get("load")):
        if load and load.get("slo"):
            return SloSpec(**load["slo"])
    return SloSpec()


def entries_of(record: dict[str, Any], source: str, label: str | None = None) -> list[Entry]:
    slo, hosts = slo_of(record), (host_speed_of(source), host_speed_of(source, "host_after_sweep.json"))
    if "modes" in record:
        return [Entry(f"{label} {mode}" if label else mode, source, record, mode, body.get("runs", []), slo, *hosts)
                for mode, body in record["modes"].items()]
    return [Entry(label or record.get("server", Path(source).name), source, record, None, record.get("runs", []),
                  slo, *hosts)]


def host_speed_of(source: str, name: str = "host.json") -> float | None:
    """The idle host's single-thread speed (`benchmarks.host_speed`'s python passes a second) that a server start's
    folder keeps beside its record (`START/host.json` with the record in START or START/sweep; `host_after_sweep.json`
    measured again once the sweep had ended): capacity follows it near the limit, so two starts are read beside it."""
    for part in source.split("+"):
        path = Path(part)
        folder = path if path.is_dir() else path.parent
        for candidate in (folder / name, folder.parent / name):
            if candidate.is_file():
                return json.loads(candidate.read_text()).get("python_per_s")
    return None


def joined_record(source: str) -> dict[str, Any]:
    """The record named by `source`, or with "A+B" one record holding the runs (and closed-loop levels) of A and of B
    (one server, no modes)."""
    records = [read_record(part) for part in source.split("+")]
    if len(records) == 1:
        return records[0]
    if any("modes" in record for record in records):
        raise SystemExit(f"{source}: only records of one server and no modes can be joined")
    joined = {**records[0], "runs": [run for record in records for run in record.get("runs", [])]}
    if any("levels" in record for record in records):
        joined["levels"] = [level for record in records for level in record.get("levels", [])]
    return joined


def load_entries(folders: list[str], labels: list[str] | None) -> tuple[list[Entry], list[Entry]]:
    """(rate entries, closed-loop entries): a closed-loop record (`benchmarks concurrency`) gives one entry whose
    runs are its levels'."""
    if labels and len(labels) != len(folders):
        raise SystemExit(f"--labels names {len(labels)} records, {len(folders)} given")
    rated, closed = [], []
    for i, folder in enumerate(folders):
        found = entries_of(joined_record(folder), folder, labels[i] if labels else None)
        for entry in found:
            if entry.record.get("kind") == "concurrency":
                closed.append(entry)
            elif not entry.runs or "rate" not in entry.runs[0]:
                raise SystemExit(f"{folder}: {entry.label} has no rate runs (a sweep or search record is needed)")
            else:
                rated.append(entry)
    for group in (rated, closed):
        names = [entry.label for entry in group]
        if len(set(names)) != len(names):
            raise SystemExit(f"entries share a label ({names}): name each record with --labels")
    return rated, closed


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.0f} ms"


def _goodput_cell(summary: ProtocolSummary) -> str:
    cells = [f"{g.goodput:.1f} req/s ({100 * g.share_of_capacity:.0f} %) at {g.rate:g}" for g in summary.goodput_at]
    return " · ".join(cells) or "not probed"


def _stability_cell(summary: ProtocolSummary) -> str:
    if not summary.unstable_rates:
        return "within 1 point"
    return "off by > 1 point at " + ", ".join(f"{r:g}" for r in summary.unstable_rates)


def _ratio_cell(summary: ProtocolSummary, baseline: ProtocolSummary | None) -> list[str]:
    return [] if baseline is None else [_ratio(summary.capacity["0.99"], baseline)]


def _ratio(ours: Capacity, baseline: ProtocolSummary) -> str:
    theirs = baseline.capacity["0.99"].rate
    if theirs <= 0:
        return "n/a"
    if ours.below is not None:
        return f"< {ours.below / theirs:.1f}×"
    return f"{ours.rate / theirs:.1f}×"


@dataclass(frozen=True, slots=True)
class HeldOnStarts:
    """What every entry named in `labels` (starts of one served code) held, per threshold."""
    labels: list[str]
    capacity: dict[str, Capacity]

    @classmethod
    def of(cls, summaries: list[ProtocolSummary], labels: list[str]) -> HeldOnStarts:
        chosen = [s for s in summaries if s.label in labels]
        return cls(labels, {t: held_on_every_start([s.capacity[t] for s in chosen]) for t in ("0.90", "0.99")})

    def line(self, baseline: ProtocolSummary | None) -> list[str]:
        at_90, at_99 = self.capacity["0.90"], self.capacity["0.99"]
        ratio = f" ({_ratio(at_99, baseline)} {baseline.label} at 99 %)" if baseline is not None else ""
        return ["", f"Held on every start of {', '.join(self.labels)}: {at_90.text()} req/s at 90 %, "
                f"{at_99.text()} req/s at 99 %{ratio}."]

    def to_json(self) -> dict[str, Any]:
        return {"labels": self.labels, "capacity": {t: dataclasses.asdict(c) for t, c in self.capacity.items()}}


def capacity_table(summaries: list[ProtocolSummary], entries: list[Entry], baseline: str | None) -> list[str]:
    reference = next((s for s in summaries if s.label == baseline), None)
    head = ["server", "capacity at 90 % (req/s)", "capacity at 99 % (req/s)", "p99 TTFA at the 99 % capacity",
            "goodput at 1.5× / 2× the 99 % capacity", "last vs first third (rates up to the 90 % capacity)"]
    head += [f"99 % capacity vs {baseline}"] if reference else []
    head += ["host, python passes/s"]
    lines = ["| " + " | ".join(head + ["commit"]) + " |", "|" + "---|" * (len(head) + 1)]
    for summary, entry in zip(summaries, entries):
        at_top = summary.row_at(summary.capacity["0.99"].rate)
        cells = [summary.label, summary.capacity["0.90"].text(), summary.capacity["0.99"].text(),
                 _ms(at_top.pooled.ttfa_p99_s) if at_top else "n/a", _goodput_cell(summary),
                 _stability_cell(summary)] + _ratio_cell(summary, reference)
        host, after = entry.host_python_per_s, entry.host_after_python_per_s
        cells.append(("n/a" if host is None else f"{host:,.0f}")
                     + ("" if after is None else f" ({after:,.0f} after its sweep)"))
        commit = str(entry.record.get("commit") or "?")[:7]
        lines.append("| " + " | ".join(cells + [commit]) + " |")
    return lines


def _refused_cell(row: RateRow) -> str:
    if row.refusal_p99_s is None:
        return _pct(row.refused_share)
    return f"{_pct(row.refused_share)} (p99 answer {_ms(row.refusal_p99_s)})"


def _rate_line(row: RateRow) -> str:
    s = row.pooled
    per_seed = " / ".join(attainment_percent(a) for a in row.attainment_per_seed)
    thirds = "n/a" if row.first_third is None or row.last_third is None else \
        f"{attainment_percent(row.first_third)} → {attainment_percent(row.last_third)}"
    cells = [f"{row.rate:g}" + (" (ended early)" if s.cut_short else ""), f"{attainment_percent(s.attainment)} %",
             per_seed,
             _ms(s.ttfa_p99_s), f"{s.goodput:.1f}", _refused_cell(row), _pct(row.failed_share),
             str(s.num_stalled), thirds]
    return "| " + " | ".join(cells) + " |"


def rate_table(summary: ProtocolSummary, entry: Entry) -> list[str]:
    seeds = ", ".join(str(s) for s in summary.rows[0].seeds) if summary.rows else ""
    windows = sorted({run["window_s"] for run in entry.runs})
    made = ", ".join(str(entry.record[key]) for key in ("commit", "created_at") if entry.record.get(key))
    lines = [f"#### {summary.label}", "",
             f"`{entry.source}`" + (f" ({made})" if made else "") + f": seeds {seeds}, "
             f"{'/'.join(f'{w:g}' for w in windows)} s windows.", "",
             "| rate (req/s) | attainment | per seed (%) | p99 TTFA, admitted | goodput (req/s) | refused (429/503) "
             "| failed | stalls | first → last third (%) |", "|" + "---|" * 9]
    return lines + [_rate_line(row) for row in summary.rows] + refusal_table(summary) + late_table(summary)


def refusal_table(summary: ProtocolSummary) -> list[str]:
    """Each rate's refusals by where the server decided them, with the time from sending to the answer."""
    rows = [(row.rate, times) for row in summary.rows for times in row.refusals_by_source]
    if not rows:
        return []
    lines = ["", "Refusals by where they were decided (time from sending to the end of the answer):", "",
             "| rate (req/s) | refused by | count | p50 | p90 | p99 |", "|" + "---|" * 6]
    return lines + [f"| {rate:g} | {t.source} | {t.count} | {_ms(t.p50_s)} | {_ms(t.p90_s)} | {_ms(t.p99_s)} |"
                    for rate, t in rows]


def late_table(summary: ProtocolSummary) -> list[str]:
    """Each rate's admitted requests whose first audio came late, and how they bunched in time."""
    rows = [(row.rate, row.late_first_audio) for row in summary.rows if row.late_first_audio]
    if not rows:
        return []
    lines = ["", "Admitted requests whose first audio came late (seconds: of each seed's window, by when they were "
             "sent; while the client paused: awaited across a send of the client's "
             f"{CLIENT_PAUSE_S * 1e3:.0f} ms or more after its schedule):", "",
             "| rate (req/s) | late | first audio p50 | first audio max | seconds with any | most in one second "
             "| while the client paused |", "|" + "---|" * 7]
    return lines + [f"| {rate:g} | {late.count} | {_ms(late.ttfa_p50_s)} | {_ms(late.ttfa_max_s)} | {late.seconds} "
                    f"| {late.most_in_one_second} | {late.while_client_paused} |" for rate, late in rows]


def concurrency_table(closed: list[Entry]) -> list[str]:
    """TTFA at a fixed number of requests in flight, one row per level of each closed-loop record."""
    lines = ["| server | in flight | TTFA p50 | TTFA p95 | TTFA p99 | RTF (mean) | audio s per wall s | completed "
             "| met the SLO | commit |", "|" + "---|" * 10]
    for entry in closed:
        commit = str(entry.record.get("commit") or "?")[:7]
        for level in entry.record.get("levels", []):
            rtf = "n/a" if level["rtf_mean"] is None else f"{level['rtf_mean']:.3f}"
            cells = [entry.label, str(level["concurrency"]), _ms(level["ttfa_p50_s"]), _ms(level["ttfa_p95_s"]),
                     _ms(level["ttfa_p99_s"]), rtf, f"{level['audio_s_per_wall_s']:.1f}",
                     f"{level['num_completed']}/{level['num_requests']}",
                     f"{level['num_met']}/{level['num_requests']}", commit]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(summaries: list[ProtocolSummary], entries: list[Entry], baseline: str | None,
             closed: list[Entry], held: HeldOnStarts | None = None) -> str:
    parts = [rates_markdown(summaries, entries, baseline, held)] if entries else []
    if closed:
        parts.append(["TTFA with a fixed number of requests in flight (closed loop: each request's end sends the "
                      "next; RTF: time from sending to the stream's end over the audio's length; met the SLO: TTFA "
                      "within the target and no stall).", ""]
                     + concurrency_table(closed))
    return "\n\n".join("\n".join(part) for part in parts) + "\n"


def rates_markdown(summaries: list[ProtocolSummary], entries: list[Entry], baseline: str | None,
                   held: HeldOnStarts | None = None) -> list[str]:
    slo = entries[0].slo
    lines = [f"SLO: TTFA ≤ {slo.ttfa_target_s * 1000:g} ms and no stall (≥ {slo.stall_threshold_s * 1000:g} ms of "
             f"playback pause); refused and failed requests are misses. Capacity: the highest rate whose attainment, "
             f"and every lower probed rate's, meets the threshold (≥: the highest probed rate still met it).", ""]
    lines += capacity_table(summaries, entries, baseline)
    if held is not None:
        lines += held.line(next((s for s in summaries if s.label == baseline), None))
    for summary, entry in zip(summaries, entries):
        lines += [""] + rate_table(summary, entry)
    return lines


def report_json(summaries: list[ProtocolSummary], entries: list[Entry], closed: list[Entry],
                held: HeldOnStarts | None = None) -> dict[str, Any]:
    return {"held_on_every_start": held.to_json() if held is not None else None,
            "concurrency": [{"label": entry.label, "source": entry.source, "server": entry.record.get("server"),
                             "commit": entry.record.get("commit"), "command": entry.record.get("command"),
                             "levels": entry.record.get("levels", [])} for entry in closed],
            "entries": [{**summary.to_json(), "source": entry.source, "mode": entry.mode,
                         "server": entry.record.get("server"), "commit": entry.record.get("commit"),
                         "created_at": entry.record.get("created_at"), "command": entry.record.get("command"),
                         "host_python_per_s": entry.host_python_per_s,
                         "host_after_sweep_python_per_s": entry.host_after_python_per_s,
                         "slo": {"ttfa_target_s": entry.slo.ttfa_target_s,
                                 "stall_threshold_s": entry.slo.stall_threshold_s}}
                        for summary, entry in zip(summaries, entries)]}


def write_plots(summaries: list[ProtocolSummary], out: Path, ttfa_target_s: float) -> list[Path]:
    try:  # the offline GPU host has no matplotlib: rerun this report elsewhere for the plots
        from benchmarks.plots import plot_series
    except ImportError:
        print("matplotlib missing: no plots", file=sys.stderr)
        return []
    series = {summary.label: [row.pooled for row in summary.rows] for summary in summaries}
    return plot_series(series, out, ttfa_target_s)


def _summarize(entry: Entry) -> ProtocolSummary:
    try:
        return summarize_protocol(entry.label, entry.runs, entry.slo)
    except ValueError as exc:  # a record slimmed before chunks were kept, or joined records that overlap
        raise SystemExit(f"{entry.source}: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="+", metavar="RECORD", help="results folder or record file; A+B joins two")
    parser.add_argument("--labels", nargs="+", help="one name per RECORD (a record of modes: LABEL MODE)")
    parser.add_argument("--baseline", help="an entry's label: every 99 %% capacity is also given as a multiple of it")
    parser.add_argument("--starts", nargs="+", metavar="LABEL",
                        help="entries that are starts of one served code: adds what every one of them held")
    parser.add_argument("--out", required=True, help="output folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    entries, closed = load_entries(args.records, args.labels)
    labels = [entry.label for entry in entries]
    if args.baseline and args.baseline not in labels:
        raise SystemExit(f"--baseline {args.baseline!r} names no entry; entries: {labels}")
    unknown = [label for label in args.starts or [] if label not in labels]
    if unknown:
        raise SystemExit(f"--starts {unknown} name no entry; entries: {labels}")
    summaries = [_summarize(entry) for entry in entries]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held = HeldOnStarts.of(summaries, args.starts) if args.starts else None
    (out / "protocol.md").write_text(markdown(summaries, entries, args.baseline, closed, held), encoding="utf-8")
    (out / "protocol.json").write_text(json.dumps(report_json(summaries, entries, closed, held), indent=1) + "\n",
                                       encoding="utf-8")
    pngs = write_plots(summaries, out, entries[0].slo.ttfa_target_s) if entries else []
    print(f"wrote {out / 'protocol.md'}, {out / 'protocol.json'} and {len(pngs)} plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
