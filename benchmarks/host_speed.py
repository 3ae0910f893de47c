"""How fast one CPU of this host runs the kind of work the engine core's thread does: `python -m benchmarks.host_speed`.

The engine core runs a step's host work (scheduling, the step's inputs, the lanes pump) in Python on one thread, so
near capacity the served rate follows that thread's speed. Hosts that report the same CPU name differ: the same
start-up work (vLLM's torch.compile of the backbone) took 19-23 s on some H200 hosts and 35-36 s on others, and the
slow ones held less (results 2026-12-04_9d9481d). Run before the server starts, on an idle host, this prints one line
(and `--json` a file) that a capacity figure can be read beside:

- `python_per_s`: passes a second over 128 rows' bookkeeping (attribute reads and writes, dict and list operations; the
  interpreter's speed, what most of the step's host time is);
- `numpy_per_s`: small numpy array builds and copies a second (the step's per-row buffers);
- `mhz`: the clock the kernel reports for each CPU now (min/max), where it reports one.

Each figure is the best of `repeats` timed runs of `seconds` each, so a moment of other work on the host lowers it less.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.record import cpu_name


@dataclass(frozen=True)
class HostSpeed:
    cpu: str
    python_per_s: float
    numpy_per_s: float
    mhz_min: float | None
    mhz_max: float | None

    def line(self) -> str:
        clock = f"{self.mhz_min:.0f}-{self.mhz_max:.0f} MHz" if self.mhz_min is not None else "clock not reported"
        return (f"host speed on one thread: python {self.python_per_s:,.0f} passes/s over 128 rows, numpy "
                f"{self.numpy_per_s:,.0f} array builds/s; {self.cpu}, {clock}")


@dataclass
class _Row:  # a running stream's bookkeeping, as the scheduler keeps one per request
    request_id: str
    frames: int = 0
    chunks: int = 0


def _python_pass(rows: list[_Row], index: dict[str, _Row]) -> int:
    due = 0
    for row in rows:
        row.frames += 1
        if row.frames % 5 == 0:
            row.chunks += 1
            due += index[row.request_id].chunks
    return due + len([r for r in rows if r.frames > 3])


def _numpy_pass(values: list[int], out: np.ndarray) -> float:
    block = np.asarray(values, dtype=np.int64)
    out[: block.size] = block
    return float(np.concatenate((out[:8], block[:8])).sum())


def _rate(work: Callable[[], object], seconds: float, repeats: int) -> float:
    """Best passes a second over `repeats` runs of about `seconds` each."""
    best = 0.0
    for _ in range(repeats):
        passes, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            for _ in range(50):
                work()
            passes += 50
        best = max(best, passes / elapsed)
    return best


def _cpu_clocks() -> tuple[float | None, float | None]:
    """The lowest and highest clock the kernel reports for the CPUs now, in MHz (None where it reports none)."""
    try:
        clocks = [float(line.partition(":")[2]) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.partition(":")[0].strip() == "cpu MHz"]
    except (OSError, ValueError):
        clocks = []
    return (min(clocks), max(clocks)) if clocks else (None, None)


def measure(seconds: float = 1.0, repeats: int = 3) -> HostSpeed:
    rows = [_Row(f"req-{i}") for i in range(128)]  # a decode batch near capacity
    index = {row.request_id: row for row in rows}
    values = list(range(128))
    out = np.zeros(256, dtype=np.int64)
    python = _rate(lambda: _python_pass(rows, index), seconds, repeats)
    numpy_ = _rate(lambda: _numpy_pass(values, out), seconds, repeats)
    return HostSpeed(cpu_name(), python, numpy_, *_cpu_clocks())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (the best counts)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    speed = measure(args.seconds, args.repeats)
    print(speed.line())
    if args.json:
        args.json.write_text(json.dumps(asdict(speed), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
