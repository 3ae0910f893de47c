"""Pick the codec's conv layout for a served run from a `codec_step` result of the same session.

    python -m benchmarks.codec_layout_choice codec_step.json '{"voxserve": {...}}'   # prints the config to serve

The config comes back with `"codec_channels_last": true` when `graph+compile+nhwc` beat `graph+compile` on the whole
GPU at the largest batch timed, else unchanged; the reason goes to stderr. Session 6 timed channels-last 1.5x faster
for one chunk but 16x slower for 16 (one cuDNN kernel), so a GPU session serves it only where it measured faster."""

from __future__ import annotations

import json
import sys

SERVED, NHWC = "graph+compile ms (whole GPU)", "graph+compile+nhwc ms (whole GPU)"


def channels_last_faster(result: dict) -> tuple[bool, str]:
    rows = [r for r in result.get("rows", []) if SERVED in r and NHWC in r]
    if not rows:
        return False, "no batch timed both layouts"
    row = max(rows, key=lambda r: r["batch"])
    faster = row[NHWC] < row[SERVED]
    return faster, f"batch {row['batch']}: channels-last {row[NHWC]:.2f} ms, served layout {row[SERVED]:.2f} ms"


def main(argv: list[str]) -> int:
    codec_json, config_json = argv
    try:
        with open(codec_json) as f:
            faster, why = channels_last_faster(json.load(f))
    except (OSError, ValueError) as exc:
        faster, why = False, f"no codec_step result ({exc})"
    config = json.loads(config_json)
    if faster:
        config.setdefault("voxserve", {})["codec_channels_last"] = True
    print(f"codec layout: {'channels-last' if faster else 'as configured'} ({why})", file=sys.stderr)
    print(json.dumps(config, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
