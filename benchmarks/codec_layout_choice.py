"""Pick the codec's conv forms (and its SM split) for a served run from measurements of the same session.

    python -m benchmarks.codec_layout_choice codec_step.json '{"voxserve": {...}}'   # prints the config to serve
    python -m benchmarks.codec_layout_choice --fig3-flags '{"voxserve": {...}}'      # the same forms for fig3.measure
    python -m benchmarks.codec_layout_choice --split-from fig3.json '{"voxserve": {...}}'  # Figure 3's chosen split

Of the compiled variants (`graph+compile` with any of the options `switches` reads: `nhwc`, `gemm`, `dgemm`, `dgemmN`,
`adgemm`, `ttail`, `tdil`, `tk7`, `tconv`, `tma`, `nolayout`, `bounded`, `static-frames`, `1x1mm`, `rowsN`), the one
with the least total time over every timed shape, among those no slower than the baselines at any shape (within
TOLERANCE) and whose samples match the first timed form's (MAX_DEVIATION), sets every codec form switch in the config as
it ran (on for its options, off for the others; `codec_gemm_dilated_min_channels`, `codec_rows_per_call`,
`codec_conv_kernels`: its value, or the defaults; so the server runs what was timed whatever the defaults); the reason
goes to stderr. Channels-last convs have cliffs at some shapes (one cuDNN kernel for one dilated conv: 1.5x faster at 16
chunks, 13x slower at 64 and at 4 chunks, sessions 6, 11, 12): a form is served only where it was timed at every
shape."""

from __future__ import annotations

import json
import sys

from vllm_voxserve.config import VoxServeConfig

# codec_step's variant options (benchmarks/codec_step.make_program) and the config switch each one is
OPTION_SWITCHES = {"nhwc": "codec_channels_last", "gemm": "codec_gemm_low_rate_convs",
                   "dgemm": "codec_gemm_wide_dilated_convs", "nolayout": "codec_layout_optimization",
                   "bounded": "codec_bounded_shapes", "static-frames": "codec_dynamic_frames",
                   "1x1mm": "codec_conv_1x1_as_mm", "tma": "codec_conv_tma"}
# the options `ttail`, `tdil`, `tk7` and `tconv` set codec_conv_kernels to "tails", "dilated", "k7" and "all" (none:
# "off")
CONV_KERNEL_OPTIONS = {"ttail": "tails", "tdil": "dilated", "tk7": "k7", "tconv": "all"}

# what `dgemm` alone makes matmuls of: the served config's dilated convs (the wide ones)
WIDE_DILATED_MIN_CHANNELS = VoxServeConfig().codec_gemm_dilated_min_channels
# the codec's settings with a value that a form sets (each a `benchmarks.fig3.measure` flag too)
VALUE_SETTINGS = ("codec_gemm_dilated_min_channels", "codec_rows_per_call", "codec_conv_kernels")


def switches(variant: str) -> dict[str, bool | int | str] | None:
    """Every codec form setting as `variant` ran (`forms`), or None for a variant the server cannot run (uncompiled,
    unknown options)."""
    options = variant.split("+")
    if options[:2] != ["graph", "compile"]:
        return None
    try:
        return forms(options[2:])
    except ValueError:
        return None


def forms(options: list[str]) -> dict[str, bool | int | str]:
    """The codec form settings (named as the config's) that these variant options set (`codec_gemm_dilated_min_channels`
    from `dgemmN` / `adgemm`, the served number otherwise; `codec_rows_per_call`, 0 without a `rowsN` option); a
    ValueError for an option that is none of them."""
    rows, dilated = rows_per_call(options), dilated_min_channels(options)
    others = set(options) - {f"rows{rows}"} - set(_dilated_options(options))
    kernels = [CONV_KERNEL_OPTIONS[o] for o in options if o in CONV_KERNEL_OPTIONS]
    if len(kernels) > 1 or not others <= set(OPTION_SWITCHES) | set(CONV_KERNEL_OPTIONS):
        raise ValueError(f"options {options}: one of {CONV_KERNEL_OPTIONS} at most, others of {list(OPTION_SWITCHES)}")
    return {"codec_channels_last": "nhwc" in options, "codec_gemm_low_rate_convs": "gemm" in options,
            "codec_conv_kernels": kernels[0] if kernels else "off",
            "codec_layout_optimization": "nolayout" not in options, "codec_bounded_shapes": "bounded" in options,
            "codec_dynamic_frames": "static-frames" not in options, "codec_conv_1x1_as_mm": "1x1mm" in options,
            "codec_conv_tma": "tma" in options,
            "codec_gemm_wide_dilated_convs": dilated > 0,
            "codec_gemm_dilated_min_channels": dilated or WIDE_DILATED_MIN_CHANNELS, "codec_rows_per_call": rows}


def rows_per_call(options: list[str]) -> int:
    """N of a variant's `rowsN` option (its batch decoded as calls of at most N rows), else 0 (one call)."""
    rows = [o.removeprefix("rows") for o in options if o.startswith("rows")]
    if len(rows) > 1 or (rows and not (rows[0].isdigit() and int(rows[0]) > 0)):
        raise ValueError(f"one rowsN option with N >= 1, got {rows}")
    return int(rows[0]) if rows else 0


def _dilated_options(options: list[str]) -> list[str]:
    return [o for o in options if o == "adgemm" or (o.startswith("dgemm") and (o[5:] == "" or o[5:].isdigit()))]


def dilated_min_channels(options: list[str]) -> int:
    """The fewest channels of a dilated conv run as a matmul: the served number for `dgemm` (the wide ones), N for
    `dgemmN`, 1 for `adgemm` (all); 0 without any of them (cuDNN's convs)."""
    found = [1 if o == "adgemm" else int(o[5:] or WIDE_DILATED_MIN_CHANNELS) for o in _dilated_options(options)]
    if len(found) > 1 or (found and found[0] < 1):
        raise ValueError(f"one dgemm, dgemmN (N >= 1) or adgemm option, got {options}")
    return found[0] if found else 0


# the forms a choice is measured against: cuDNN's convs, the wide dilated convs as matmuls (the default to session 13)
# and the server's default since session 14 (the other dilated convs on the conv kernel, a compile per chunk length)
SERVED = "graph+compile+dgemm+tk7+tma+static-frames"  # since session 16 (every k7 conv on the TMA kernel)
BASELINES = ("graph+compile", "graph+compile+dgemm", "graph+compile+dgemm+tdil+static-frames", SERVED)
# how much slower than the fastest baseline a form may be at one shape (timing noise) and still be served
TOLERANCE = 0.05
# the most a form's samples may differ from the first timed form's (codec_step's "rms deviation": RMS of the
# difference over the RMS) and still be served: bf16 rounding in another order differs by far less, a wrong kernel by
# about 1 (uncorrelated audio) or more
MAX_DEVIATION = 0.25
DEVIATION = "rms deviation"


def fastest_variant(result: dict) -> tuple[str | None, str]:
    """Of the servable variants timed at every shape (batch, frames, place) where a baseline was, the least total
    time among those never more than TOLERANCE slower than the fastest baseline at a shape, and why; None (serve
    as configured) where no baseline was timed. Every shape counts: session 12 served channels-last convs chosen
    at 64 chunks, and 4 chunks of 10 frames (urgent lane, small background batches) took 57 ms instead of 4.3."""
    times: dict[str, dict[tuple, float]] = {}
    wrong: dict[str, str] = {}
    for row in result.get("rows", []):
        for key, t in row.items():
            variant, sep, place = key.partition(" ms (")
            if sep and switches(variant) is not None:
                times.setdefault(variant, {})[(row["batch"], row.get("frames"), place.rstrip(")"))] = t
            variant, sep, _ = key.partition(f" {DEVIATION}")
            if sep and t > MAX_DEVIATION:
                wrong[variant] = f"{variant} {t:.3f} at {row['batch']} x {row.get('frames')} frames"
    times = {v: by_shape for v, by_shape in times.items() if v not in wrong}
    shapes = {shape for b in BASELINES for shape in times.get(b, {})}
    if not shapes:
        return None, "neither baseline compiled form was timed"
    best_baseline = {shape: min(times[b][shape] for b in BASELINES if shape in times.get(b, {})) for shape in shapes}
    totals, slower = {}, {}
    for variant, by_shape in times.items():
        if not shapes <= set(by_shape):
            continue
        worst = max(shapes, key=lambda sh: by_shape[sh] / best_baseline[sh])
        if by_shape[worst] > best_baseline[worst] * (1 + TOLERANCE):
            slower[variant] = f"{variant} {by_shape[worst]:.2f} ms at {_shape(worst)}"
        else:
            totals[variant] = sum(by_shape[sh] for sh in shapes)
    why = f"total over {len(shapes)} shapes: " + ", ".join(f"{v} {t:.1f} ms" for v, t in totals.items())
    if slower:
        why += "; slower than a baseline: " + ", ".join(slower.values())
    if wrong:
        why += f"; samples off the first form's by more than {MAX_DEVIATION} (RMS): " + ", ".join(wrong.values())
    if not totals:  # e.g. each baseline timed at shapes the other was not: nothing was timed everywhere
        return None, "no form was timed at every shape and never slower; " + why
    return min(totals, key=totals.get), why


def _shape(shape: tuple) -> str:
    batch, frames, place = shape
    return f"{batch} x {frames} frames ({place})"


def fig3_flags(config: dict) -> str:
    """`benchmarks.fig3.measure`'s flags (named as the switches) for the conv forms a served config sets; the
    others stay as served."""
    voxserve = config.get("voxserve", {})
    flags = [("--" if voxserve[key] else "--no-") + key.replace("_", "-")
             for key in OPTION_SWITCHES.values() if key in voxserve]
    flags += [f"--{key.replace('_', '-')} {voxserve[key]}" for key in VALUE_SETTINGS if key in voxserve]
    return " ".join(flags)


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
