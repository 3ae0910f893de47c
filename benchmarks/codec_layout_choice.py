"""Pick the codec's conv forms (and its SM split) for a served run from measurements of the same session.

    python -m benchmarks.codec_layout_choice codec_step.json '{"voxserve": {...}}'   # prints the config to serve
    python -m benchmarks.codec_layout_choice --fig3-flags '{"voxserve": {...}}'      # the same forms for fig3.measure
    python -m benchmarks.codec_layout_choice --split-from fig3.json '{"voxserve": {...}}'  # Figure 3's chosen split

Of the compiled variants timed on the whole GPU at the largest batch (`graph+compile` as served, `+nhwc`, `+gemm`,
`+nhwc+gemm`), the fastest sets its switches (`codec_channels_last`, `codec_gemm_low_rate_convs`) in the config; the
reason goes to stderr. Session 6 timed channels-last 1.5x faster for one chunk but 16x slower for 16 (one cuDNN
kernel), so a GPU session serves a form only where it measured faster."""

from __future__ import annotations

import json
import sys

SWITCHES = {"graph+compile": {}, "graph+compile+nhwc": {"codec_channels_last": True},
            "graph+compile+gemm": {"codec_gemm_low_rate_convs": True},
            "graph+compile+nhwc+gemm": {"codec_channels_last": True, "codec_gemm_low_rate_convs": True},
            "graph+compile+dgemm": {"codec_gemm_wide_dilated_convs": True},
            "graph+compile+gemm+dgemm": {"codec_gemm_low_rate_convs": True, "codec_gemm_wide_dilated_convs": True}}


def fastest_variant(result: dict) -> tuple[str, str]:
    """The fastest variant at the largest batch that timed the served one, and why (served when none timed)."""
    served = "graph+compile ms (whole GPU)"
    rows = [r for r in result.get("rows", []) if served in r]
    if not rows:
        return "graph+compile", "the served variant was not timed"
    row = max(rows, key=lambda r: r["batch"])
    times = {v: row[f"{v} ms (whole GPU)"] for v in SWITCHES if f"{v} ms (whole GPU)" in row}
    best = min(times, key=times.get)
    return best, f"batch {row['batch']}: " + ", ".join(f"{v} {t:.2f} ms" for v, t in times.items())


FIG3_FLAGS = {"codec_channels_last": "--codec-channels-last", "codec_gemm_low_rate_convs": "--codec-gemm-low-rate-convs",
              "codec_gemm_wide_dilated_convs": "--codec-gemm-wide-dilated-convs"}


def fig3_flags(config: dict) -> str:
    """`benchmarks.fig3.measure`'s flags for the conv forms a served config sets (the others stay as served)."""
    voxserve = config.get("voxserve", {})
    return " ".join(flag if voxserve[key] else flag.replace("--", "--no-", 1)
                    for key, flag in FIG3_FLAGS.items() if key in voxserve)


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
        best, why = "graph+compile", f"no codec_step result ({exc})"
    config = json.loads(config_json)
    config.setdefault("voxserve", {}).update(SWITCHES[best])
    print(f"codec conv forms: {best} ({why})", file=sys.stderr)
    print(json.dumps(config, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
