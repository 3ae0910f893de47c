"""python -m benchmarks.simulation: sweep the simulated server, print one summary line, write JSON.

Example (the paper's protocol: 60 s per rate, three seeds):
    python -m benchmarks.simulation --rates 30:84:6 --window 60 --seeds 0,1,2 --out sim.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.simulation.sweep import MODES, parse_rates, study
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {sorted(MODES)}")
    parser.add_argument("--rates", default="30:84:6", help='req/s: "start:stop:step" or "a,b,c"')
    parser.add_argument("--window", type=float, default=60.0, help="arrival window per rate and seed, seconds")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, pooled per rate")
    parser.add_argument("--overload-factor", type=float, default=1.5)
    parser.add_argument("--config", default="{}", help="JSON overrides of SchedulerPolicyConfig")
    parser.add_argument("--out", type=Path, default=Path("simulation.json"))
    args = parser.parse_args(argv)

    base = SchedulerPolicyConfig.from_dict(json.loads(args.config))
    modes = [m for m in args.modes.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    summary = study(modes, parse_rates(args.rates), args.window, seeds, args.overload_factor, base=base)
    args.out.write_text(json.dumps(summary, indent=1))

    capacity = " ".join(f"{m}={c:g}" for m, c in summary["capacity_90"].items())
    overload = " ".join(
        f"{m}={o['result']['goodput']:.1f}req/s({100 * o['goodput_share_of_peak']:.0f}%)"
        for m, o in summary["overload"].items()
    )
    print(
        f"SLO capacity@90% (req/s): {capacity} | goodput at {summary['overload_rate']:g} req/s "
        f"({args.overload_factor:g}x, % of own peak): {overload} | json: {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
