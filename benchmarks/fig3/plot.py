"""Draw Figure 3 from `measure.py`'s JSON: `python -m benchmarks.fig3.plot fig3.json [--out fig3.png]`.

(a) backbone speed on each LM partition, as a share of its whole-GPU speed (the paper's bar: 93 % at 108 SMs);
(b) backbone and codec throughput side by side on each split, against the time-sharing line between the two
components' whole-GPU throughputs; (c) codec latency for 1 and N chunks, whole GPU and on the codec partition beside
the running backbone, with the paper's compiled-codec figures as markers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

PAPER_MS = {"whole_1": 1.9, "whole_n": 10.0, "beside_n_24sms": 49.0}  # paper §2.3 (H100), batch 1 / 16


def throughputs(result: dict) -> dict:
    """Frames per second of each component alone on the whole GPU (the ends of the time-sharing line)."""
    work, whole = result["workload"], result["whole_gpu"]
    n = work["codec_batch"]
    return {"backbone": work["backbone_batch"] * 1000.0 / whole["backbone_step_ms"],
            "codec": n * work["frames"] * 1000.0 / whole[f"codec_batch{n}_ms"]}


def backbone_share(alone_row: dict, whole: dict) -> float:
    """The backbone's speed on a partition as a share of its whole-GPU speed, against the whole-GPU step timed right
    after it where the record has one (older records: the one whole-GPU figure)."""
    return alone_row.get("backbone_whole_gpu_ms", whole["backbone_step_ms"]) / alone_row["backbone_step_ms"]


def above_time_sharing(point: dict, ends: dict) -> bool:
    """A split beats time sharing when its (backbone, codec) throughputs lie above the line between the ends."""
    return point["backbone_frames_per_s"] / ends["backbone"] + point["codec_frames_per_s"] / ends["codec"] > 1.0


def draw(result: dict, out: Path) -> Path:
    work, whole, ends = result["workload"], result["whole_gpu"], throughputs(result)
    n = work["codec_batch"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    # (a)
    alone = sorted(result["alone"], key=lambda m: m["lm_sms"])
    share = [100.0 * backbone_share(m, whole) for m in alone]
    a.plot([m["lm_sms"] for m in alone] + [result["sm_count"]], share + [100.0], "o-")
    a.axhline(93, ls=":", c="gray", label="93 % (paper)")
    a.set(xlabel="backbone SMs", ylabel="decode speed (% of whole GPU)",
          title=f"(a) backbone, batch {work['backbone_batch']}")
    a.legend()
    # (b)
    side = result["side_by_side"]
    b.plot([ends["backbone"], 0], [0, ends["codec"]], ls="--", c="gray", label="time sharing")
    for m in side:
        color = "tab:green" if above_time_sharing(m, ends) else "tab:red"
        b.scatter(m["backbone_frames_per_s"], m["codec_frames_per_s"], c=color)
        b.annotate(f"{m['codec_sms']}", (m["backbone_frames_per_s"], m["codec_frames_per_s"]), fontsize=8,
                   textcoords="offset points", xytext=(4, 4))
    # a run cut short (measure.py saves after every stage) may lack the later parts: draw what is there
    chosen = next((m for m in side if m["codec_sms"] == result.get("chosen_codec_sms")), None)
    if chosen:
        b.scatter(chosen["backbone_frames_per_s"], chosen["codec_frames_per_s"], s=160, facecolors="none",
                  edgecolors="k", label=f"chosen: {chosen['codec_sms']} codec SMs")
    b.set(xlabel="backbone frames/s", ylabel="codec frames/s", title="(b) splits (labels: codec SMs)")
    b.legend()
    # (c)
    beside = {m["codec_sms"]: m for m in side}
    shown = beside.get(24) or chosen or (side[0] if side else None)
    labels = ["1 chunk\nwhole GPU", f"{n} chunks\nwhole GPU"]
    values = [whole["codec_batch1_ms"], whole[f"codec_batch{n}_ms"]]
    if shown is not None:
        labels += [f"1 chunk\n{shown['codec_sms']} SMs beside", f"{n} chunks\n{shown['codec_sms']} SMs beside"]
        values += [shown["codec_batch1_ms"], shown["codec_batch_ms"]]
    c.bar(range(len(values)), values, color=["tab:blue", "tab:blue", "tab:orange", "tab:orange"][: len(values)])
    c.scatter([0, 1], [PAPER_MS["whole_1"], PAPER_MS["whole_n"]], marker="_", s=600, c="k", label="paper (H100)")
    if shown is not None and shown["codec_sms"] == 24 and n == 16:
        c.scatter([3], [PAPER_MS["beside_n_24sms"]], marker="_", s=600, c="k")
    c.set_xticks(range(len(values)), labels, fontsize=8)
    c.set(ylabel="ms per call", title=f"(c) codec, {work['frames']} frames per chunk")
    c.legend()
    fig.suptitle(f"{result['gpu']}: backbone and codec on SM partitions")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--out")
    args = ap.parse_args()
    result = json.loads(Path(args.json).read_text())
    print(draw(result, Path(args.out or Path(args.json).with_suffix(".png"))))


if __name__ == "__main__":
    main()
