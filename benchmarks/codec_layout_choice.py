"""Pick the codec's conv forms (and its SM split) for a served run from measurements of the same session.

    python -m benchmarks.codec_layout_choice codec_step.json '{"voxserve": {...}}'   # prints the config to serve
    python -m benchmarks.codec_layout_choice --fig3-flags '{"voxserve": {...}}'      # the same forms for fig3.measure
    python -m benchmarks.codec_layout_choice --split-from fig3.json '{"voxserve": {...}}'  # Figure 3's chosen split

Of the compiled variants timed on the whole GPU at the largest batch (`graph+compile` with any of `nhwc`, `gemm`,
`dgemm`, `rowsN`), the fastest sets every conv switch in the config as it ran (`codec_channels_last`,
`codec_gemm_low_rate_convs`, `codec_gemm_wide_dilated_convs`: on for its options, off for the others;
`codec_rows_per_call`: N, or 0; so the server runs what was timed whatever the defaults); the reason goes to stderr.
Session 6 timed channels-last 1.5x faster for one chunk but 16x slower for 16 (one cuDNN kernel), session 11 1.5x
faster for 16 but 13x slower for 64: a GPU session serves a form only where it measured faster."""

from __future__ import annotations

import json
import sys

# codec_step's variant options (benchmarks/codec_step.make_program) and the config switch each one is
OPTION_SWITCHES = {"nhwc": "codec_channels_last", "gemm": "codec_gemm_low_rate_convs",
                   "dgemm": "codec_gemm_wide_dilated_convs"}


def switches(variant: str) -> dict[str, bool | int] | None:
    """Every conv switch as `variant` ran (and `codec_rows_per_call`, 0 without a `rowsN` option), or None for a
    variant the server cannot run (uncompiled, other options)."""
    options = variant.split("+")
    try:
        rows = rows_per_call(options)
    except ValueError:
        return None
    if options[:2] != ["graph", "compile"] or not set(options[2:]) - {f"rows{rows}"} <= set(OPTION_SWITCHES):
        return None
    return {**{switch: option in options[2:] for option, switch in OPTION_SWITCHES.items()},
            "codec_rows_per_call": rows}


def rows_per_call(options: list[str]) -> int:
    """N of a variant's `rowsN` option (its batch decoded as calls of at most N rows), else 0 (one call)."""
    rows = [o.removeprefix("rows") for o in options if o.startswith("rows")]
    if len(rows) > 1 or (rows and not (rows[0].isdigit() and int(rows[0]) > 0)):
        raise ValueError(f"one rowsN option with N >= 1, got {rows}")
    return int(rows[0]) if rows else 0


# the forms a choice is measured against: cuDNN's convs, and the server's default (the wide dilated convs as matmuls)
BASELINES = ("graph+compile", "graph+compile+dgemm")


def fastest_variant(result: dict) -> tuple[str | None, str]:
    """The fastest variant at the largest batch that timed a baseline form, and why; None (serve as configured)
    where no baseline was timed."""
    rows = [r for r in result.get("rows", []) if any(f"{b} ms (whole GPU)" in r for b in BASELINES)]
    if not rows:
        return None, "neither baseline compiled form was timed"
    row = max(rows, key=lambda r: r["batch"])
    times = {key.removesuffix(" ms (whole GPU)"): t for key, t in row.items()
             if key.endswith(" ms (whole GPU)") and switches(key.removesuffix(" ms (whole GPU)")) is not None}
    best = min(times, key=times.get)
    return best, f"batch {row['batch']}: " + ", ".join(f"{v} {t:.2f} ms" for v, t in times.items())


def fig3_flags(config: dict) -> str:
    """`benchmarks.fig3.measure`'s flags (named as the switches) for the conv forms a served config sets; the
    others stay as served."""
    voxserve = config.get("voxserve", {})
    return " ".join(("--" if voxserve[key] else "--no-") + key.replace("_", "-")
                    for key in OPTION_SWITCHES.values() if key in voxserve)


def split_from_fig3(fig3: dict, config: dict) -> tuple[dict, str]:
    """The config with Figure 3's chosen codec SMs as its split, where the chooser found one that keeps up."""
    sms = fig3.get("chosen_codec_sms")
    if not isinstance(sms, int) or not fig3.get("chosen_keeps_up"):
        return config, "no split kept up in Figure 3: the configured split stays"
    lanes = config.setdefault("voxserve", {}).setdefault("lanes", {})
    lanes["split"] = {"group": "codec", "group_sms": sms}
    return config, f"Figure 3 chose {sms} codec SMs"


def main(argv: list[str]) -> int:
    if argv[0] == "--fig3-flags":
        print(fig3_flags(json.loads(argv[1])))
        return 0
    if argv[0] == "--split-from":
        config = json.loads(argv[2])
        try:
            with open(argv[1]) as f:
                config, why = split_from_fig3(json.load(f), config)
        except (OSError, ValueError) as exc:
            why = f"no Figure 3 result ({exc}): the configured split stays"
        print(f"codec split: {why}", file=sys.stderr)
        print(json.dumps(config, separators=(",", ":")))
        return 0
    codec_json, config_json = argv
    try:
        with open(codec_json) as f:
            best, why = fastest_variant(json.load(f))
    except (OSError, ValueError) as exc:
        best, why = None, f"no codec_step result ({exc})"
    config = json.loads(config_json)
    if best is not None:
        config.setdefault("voxserve", {}).update(switches(best))
    print(f"codec conv forms: {best or 'as configured'} ({why})", file=sys.stderr)
    print(json.dumps(config, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
