"""`python -m benchmarks sweep|search|ablation|concurrency|text-stream ...`: writes record.json (and, but for
concurrency, PNG plots), prints one summary line per server, mode or concurrency level."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.ablation import ABLATION_MODES, DEFAULT_MODES, AblationConfig, run_ablation
from benchmarks.capacity_search import SearchConfig, run_search
from benchmarks.client import PROFILES, make_profile
from benchmarks.concurrency import ConcurrencyConfig, format_level_line, run_concurrency
from benchmarks.metrics import SloSpec
from benchmarks.modes import make_switcher
from benchmarks.record import build_record, write_record
from benchmarks.report import one_line, result_body, write_outputs
from benchmarks.sweep import LoadConfig, SweepConfig, run_sweep
from benchmarks.text_stream import DEFAULT_WORDS_PER_S, TextStreamGenerator
from benchmarks.workload import FRAMES_PER_WORD


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _mode_rates(text: str) -> dict[str, float]:
    """"lanes=88,vllm-stock=40" -> {"lanes": 88.0, "vllm-stock": 40.0}"""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"want MODE=RATE,..., got {text!r}")
    return {mode.strip(): float(rate) for mode, rate in pairs}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server and requests")
    g.add_argument("--base-url", default="http://127.0.0.1:8000")
    g.add_argument("--profile", choices=sorted(PROFILES), default="ours", help="which request fields to send")
    g.add_argument("--server-name", help="label in the record and plots (default: the profile)")
    g.add_argument("--model")
    g.add_argument("--voice", help='speaker; "" leaves the field out (also for the other string fields)')
    g.add_argument("--response-format", choices=("pcm", "wav"))
    g.add_argument("--sample-rate", type=int, help="PCM sample rate (WAV headers override it)")
    g.add_argument("--task-type")
    g.add_argument("--language")
    g.add_argument("--instructions")
    g.add_argument("--extra-json", help="JSON object merged into every request last")
    g = p.add_argument_group("workload and load")
    g.add_argument("--workload", help="TSV (utt_id<TAB>text) or one text per line; default LibriTTS test-clean")
    g.add_argument("--max-words", type=int, help="keep only texts of at most this many words (short utterances)")
    g.add_argument("--fixed-length", action="store_true", help="random-weight models: length from word count")
    g.add_argument("--frames-per-word", type=float, default=FRAMES_PER_WORD)
    g.add_argument("--seeds", type=_ints, default=(0,), help="comma-separated arrival/text-order seeds")
    g.add_argument("--window-s", type=float, help="arrival window per rate and seed (sweep 60, search 20)")
    g.add_argument("--request-timeout-s", type=float, default=900.0)
    g.add_argument("--warmup", type=int, default=64, help="size of the discarded concurrent warm-up burst")
    g.add_argument("--slo-ms", type=float, default=200.0, help="TTFA target")
    g.add_argument("--stall-ms", type=float, default=10.0, help="total playback pause that counts as a stall")
    g.add_argument("--stop-fraction", type=float, default=0.5,
                   help="stop after a rate where fewer than this fraction get audio within 1 s")
    g.add_argument("--time-budget-s", type=float, help="start no rate that would end after this many seconds")
    g.add_argument("--out", help="output directory (default bench-results/<command>-<UTC time>)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (each rate's or level's line still prints when it ends)")


def _add_sweep_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--rates", type=_floats, default=(), help="explicit comma-separated rates (req/s)")
    g.add_argument("--start-rate", type=float, default=2.0)
    g.add_argument("--rate-step", type=float, default=2.0)
    g.add_argument("--max-rate", type=float, default=200.0)
    g.add_argument("--beyond-failure", type=int, default=None,
                   help="stop this many rates after the first whose attainment is below --failure-threshold")
    g.add_argument("--failure-threshold", type=float, default=0.99)


def _add_search_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    g = p.add_argument_group("capacity search")
    g.add_argument(f"--{prefix}start-rate", dest="search_start_rate", type=float, default=8.0)
    g.add_argument("--resolution", type=float, default=2.0)
    g.add_argument(f"--{prefix}max-rate", dest="search_max_rate", type=float, default=256.0)
    g.add_argument("--thresholds", type=_floats, default=(0.99, 0.90))
    g.add_argument("--allow-short-window", action="store_true", help="tests only: windows under 20 s")
    g.add_argument("--no-settle-early", action="store_true",
                   help="run every probe to the end even once it is sure to miss the lowest threshold")


def _add_concurrency_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("closed loop")
    g.add_argument("--levels", type=_ints, default=(1, 4, 8, 16, 32), help="comma-separated requests in flight")
    g.add_argument("--requests-per-level", type=int, default=64, help="requests per level and seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sweep = sub.add_parser("sweep", help="every rate in steps until overload")
    _add_load_args(sweep)
    _add_sweep_args(sweep)
    search = sub.add_parser("search", help="bracket-and-bisect SLO capacity with shorter windows")
    _add_load_args(search)
    _add_search_args(search)
    ablation = sub.add_parser("ablation", help="our server's modes side by side",
                              epilog="modes: " + "; ".join(f"{k}: {v}" for k, v in ABLATION_MODES.items()))
    _add_load_args(ablation)
    _add_sweep_args(ablation)
    _add_search_args(ablation, prefix="search-")
    ablation.add_argument("--modes", type=lambda s: tuple(m for m in s.split(",") if m), default=DEFAULT_MODES)
    ablation.add_argument("--strategy", choices=("sweep", "search"), default="search")
    ablation.add_argument("--chain-start", action="store_true",
                          help="search: start each mode at the previous mode's capacity (modes weakest first)")
    ablation.add_argument("--mode-start-rates", type=_mode_rates, default={},
                          help="search: MODE=RATE,... a mode's first rate (over --chain-start for that mode)")
    ablation.add_argument("--restart-command", help="shell line with {mode}, used if the server cannot switch "
                                                    "modes over HTTP")
    ablation.add_argument("--ready-path", default="/health")
    concurrency = sub.add_parser("concurrency", help="closed loop: TTFA with a fixed number of requests in flight")
    _add_load_args(concurrency)
    _add_concurrency_args(concurrency)
    text = sub.add_parser("text-stream", help="a sweep whose requests send their text word by word over the "
                                              "WebSocket (WS /v1/audio/speech/stream)")
    _add_load_args(text)
    _add_sweep_args(text)
    g = text.add_argument_group("text stream")
    g.add_argument("--text-words-per-s", type=float, default=DEFAULT_WORDS_PER_S, help="words sent per second")
    g.add_argument("--lookahead-words", type=int, default=0,
                   help="words past a chunk's own that its audio may wait for without the wait counting as a stall")
    return parser


def _load_config(args, default_window_s: float) -> LoadConfig:
    profile = make_profile(args.profile, args.extra_json, model=args.model, voice=args.voice,
                           response_format=args.response_format, sample_rate=args.sample_rate,
                           task_type=args.task_type, language=args.language, instructions=args.instructions)
    return LoadConfig(base_url=args.base_url, profile=profile, workload_path=args.workload, max_words=args.max_words,
                      fixed_length=args.fixed_length, frames_per_word=args.frames_per_word, seeds=args.seeds,
                      window_s=args.window_s or default_window_s, request_timeout_s=args.request_timeout_s,
                      warmup_requests=args.warmup, slo=SloSpec(args.slo_ms / 1000, args.stall_ms / 1000),
                      stop_fraction=args.stop_fraction, time_budget_s=args.time_budget_s,
                      progress=not args.no_progress)


def _sweep_config(args, load: LoadConfig) -> SweepConfig:
    return SweepConfig(load=load, rates=args.rates, start_rate=args.start_rate, rate_step=args.rate_step,
                       max_rate=args.max_rate, beyond_failure=args.beyond_failure,
                       failure_threshold=args.failure_threshold)


def _search_config(args, load: LoadConfig) -> SearchConfig:
    return SearchConfig(load=load, start_rate=args.search_start_rate, resolution=args.resolution,
                        max_rate=args.search_max_rate, thresholds=args.thresholds,
                        allow_short_window=args.allow_short_window, settle_early=not args.no_settle_early)


def _run_concurrency(args, load: LoadConfig, label: str, out: Path, command: list[str]) -> int:
    config = ConcurrencyConfig(load=load, levels=args.levels, requests_per_level=args.requests_per_level)

    def record_of(result) -> dict:
        body = {"strategy": "concurrency", "stop_reason": result.stop_reason,
                "levels": [dataclasses.asdict(s) for s in result.summaries],
                "runs": [run.to_json() for run in result.runs]}
        record = build_record("concurrency", label, args.model, config, body, command)
        record["summary"] = [f"{label}: {format_level_line(s)}" for s in result.summaries]
        return record

    # rewritten after every level, so a killed run keeps what it measured
    result = run_concurrency(config, on_update=lambda r: write_record(record_of(r), out / "record.json"))
    record = record_of(result)
    print(f"wrote {write_record(record, out / 'record.json')}", file=sys.stderr)
    for line in record["summary"]:
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    strategy = {"ablation": getattr(args, "strategy", None), "text-stream": "sweep"}.get(args.command, args.command)
    load = _load_config(args, 60.0 if strategy == "sweep" else 20.0)
    label = args.server_name or args.profile
    out = Path(args.out or f"bench-results/{args.command}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
    if args.command == "concurrency":
        return _run_concurrency(args, load, label, out, command)
    sweep = _sweep_config(args, load) if strategy == "sweep" else None
    search = _search_config(args, load) if strategy == "search" else None
    extra: dict = {}

    make_generator = None
    if args.command == "ablation":
        config = AblationConfig(modes=args.modes, sweep=sweep, search=search, chain_start=args.chain_start,
                                start_rates=args.mode_start_rates)
    elif args.command == "text-stream":
        config = {"sweep": dataclasses.asdict(sweep), "text_words_per_s": args.text_words_per_s,
                  "lookahead_words": args.lookahead_words}
        make_generator = functools.partial(TextStreamGenerator, words_per_s=args.text_words_per_s,
                                           lookahead_words=args.lookahead_words)
    else:
        config = sweep or search

    def record_of(results: dict) -> dict:
        if args.command == "ablation":
            body = {**extra, "modes": {mode: result_body(r) for mode, r in results.items()}}
        else:
            body = result_body(results[label])
        record = build_record(args.command, label, args.model, config, body, command)
        record["summary"] = [one_line(name, r, load.slo, load.seeds) for name, r in results.items()]
        skipped = extra.get("mode_switch_errors", {})
        record["summary"] += [f"{mode}: not measured: {error}" for mode, error in skipped.items()]
        return record

    def save_partial(results: dict) -> None:  # after every rate, so a killed run keeps what it measured
        write_outputs(record_of(results), results, out, load.slo, plots=False)

    if args.command == "ablation":
        switcher = make_switcher(args.base_url, args.restart_command, args.ready_path, log_dir=str(out))
        extra["switcher"] = type(switcher).__name__
        extra["mode_switch_errors"] = {}  # modes the server could not switch to, each with its error
        results, extra["mode_switch_s"] = run_ablation(config, switcher, on_update=save_partial,
                                                       switch_errors=extra["mode_switch_errors"])
    elif make_generator is not None:
        results = {label: run_sweep(sweep, on_update=lambda r: save_partial({label: r}),
                                    make_generator=make_generator)}
    elif sweep is not None:
        results = {label: run_sweep(sweep, on_update=lambda r: save_partial({label: r}))}
    else:
        results = {label: run_search(search, on_update=lambda r: save_partial({label: r}))}
    record = record_of(results)
    json_path, pngs = write_outputs(record, results, out, load.slo)
    print(f"wrote {json_path} and {len(pngs)} plots in {out}", file=sys.stderr)
    for line in record["summary"]:
        print(line)
    return 1 if extra.get("mode_switch_errors") else 0
