"""python -m benchmarks.simulation: sweep the simulated server, print one summary line, write JSON.

Examples (the paper's protocol: 60 s per rate, three seeds):
    python -m benchmarks.simulation --rates 30:84:6 --window 60 --seeds 0,1,2 --out sim.json
    python -m benchmarks.simulation --gpu h200 --modes deadline_aware,deadline_aware_shed \
        --reference deadline_aware --rates 120:200:10 --overload-factors 1.5,2 --out h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from benchmarks.simulation.sweep import GPUS, MODES, parse_rates, study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {sorted(MODES)}")
    parser.add_argument("--rates", default="30:84:6", help='req/s: "start:stop:step" or "a,b,c"')
    parser.add_argument("--window", type=float, default=60.0, help="arrival window per rate and seed, seconds")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, pooled per rate")
    parser.add_argument("--overload-factors", default="1.5", help="comma-separated multiples of the capacity")
    parser.add_argument("--reference", default="deadline_aware", help="the mode whose capacity the factors scale")
    parser.add_argument("--gpu", default="paper_h100", choices=sorted(GPUS),
                        help="simulated GPU: its cost seed and the policy sizes it was served with")
    parser.add_argument("--config", default="{}", help="JSON overrides of SchedulerPolicyConfig")
    parser.add_argument("--gpu-config", default="{}",
                        help='JSON overrides of the simulated GPU (GpuModel), e.g. {"host_per_row_s": 1e-5}')
    parser.add_argument("--max-words", type=int, default=None,
                        help="only LibriTTS texts of at most this many words (a short-utterance workload)")
    parser.add_argument("--out", type=Path, default=Path("simulation.json"))
    args = parser.parse_args(argv)

    policy, gpu = GPUS[args.gpu]
    gpu = dataclasses.replace(gpu, **json.loads(args.gpu_config))
    overrides = json.loads(args.config)
    if "demand_horizons_s" in overrides:
        overrides["demand_horizons_s"] = tuple(overrides["demand_horizons_s"])
    base = policy.replace(**overrides)
    modes = [m for m in args.modes.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    factors = [float(f) for f in args.overload_factors.split(",") if f]
    summary = study(modes, parse_rates(args.rates), args.window, seeds, factors, args.reference, base, gpu,
                    args.max_words)
    args.out.write_text(json.dumps(summary, indent=1))

    capacity = " ".join(f"{m}={c:g}" for m, c in summary["capacity_90"].items())
    print(f"SLO capacity@90% (req/s): {capacity}; reference {args.reference} {summary['reference_capacity']:g}")
    for factor, at_factor in summary["overload"].items():
        overload = " ".join(
            f"{m}={o['result']['goodput']:.1f}req/s({100 * o['goodput_share_of_capacity']:.0f}% of capacity, "
            f"p99 TTFA {o['result']['ttfa_p99_ms'] or 0:.0f} ms)"
            for m, o in at_factor.items() if m != "rate"
        )
        print(f"goodput at {at_factor['rate']:g} req/s ({factor}x): {overload}")
    print(f"json: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
