"""PNG plots against offered rate: SLO attainment, p99 TTFA and goodput, one line per server or mode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from benchmarks.metrics import RateSummary  # noqa: E402


def _lines(ax, series: Mapping[str, Sequence[RateSummary]], value) -> None:
    marked = False
    for label, summaries in series.items():
        points = [(s.rate, value(s), s.cut_short) for s in sorted(summaries, key=lambda s: s.rate)
                  if value(s) is not None]
        if not points:
            continue
        (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
        cut = [p for p in points if p[2]]
        if cut:  # probes that ended early: their values are bounds, not measurements
            ax.plot([p[0] for p in cut], [p[1] for p in cut], linestyle="none", marker="x", markersize=7,
                    color=line.get_color(), label=None if marked else "ended early (bound)")
            marked = True


def _save(fig, ax, path: Path, title: str, series: Mapping[str, Sequence[RateSummary]]) -> Path:
    ax.set_xlabel("offered load (req/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1 or any(ax.get_legend_handles_labels()[1]):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_series(series: Mapping[str, Sequence[RateSummary]], out_dir: str | Path, ttfa_target_s: float,
                thresholds: Sequence[float] = (0.90, 0.99), prefix: str = "") -> list[Path]:
    """Write attainment.png, ttfa_p99.png and goodput.png (with `prefix`) into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(5, 3.5))
    _lines(ax, series, lambda s: 100 * s.attainment)
    for th in thresholds:
        ax.axhline(100 * th, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 102)
    paths.append(_save(fig, ax, out / f"{prefix}attainment.png",
                       f"TTFA <= {ttfa_target_s * 1000:.0f} ms, no stall", series))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    _lines(ax, series, lambda s: None if s.ttfa_p99_s is None else 1000 * s.ttfa_p99_s)
    ax.axhline(1000 * ttfa_target_s, color="grey", linestyle=":", linewidth=1, label="TTFA target")
    ax.set_ylabel("p99 TTFA (ms)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    paths.append(_save(fig, ax, out / f"{prefix}ttfa_p99.png", "p99 time to first audio", series))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    _lines(ax, series, lambda s: s.goodput)
    rates = [s.rate for summaries in series.values() for s in summaries]
    if rates:
        ax.plot([0, max(rates)], [0, max(rates)], color="grey", linestyle=":", linewidth=1, label="offered")
    ax.set_ylabel("goodput (req/s within SLO)")
    paths.append(_save(fig, ax, out / f"{prefix}goodput.png", "goodput", series))
    return paths
