"""Where a process's host time goes: `python -m benchmarks.host_profile STACKS [--top 30] [--thread MainThread]`.

STACKS is py-spy's raw (collapsed) output (or its .xz), sampled with thread names and without line numbers, e.g.
`py-spy record --pid PID --duration 10 --rate 250 --format raw --nolineno --threads --nonblocking --output STACKS`
(benchmarks/gpu_host/profile_host.sh samples the engine core and the API server under load). Only busy samples are recorded,
so a thread's samples are its CPU time; a CUDA wait that spins counts as busy. For each thread with the most samples
it prints the functions by inclusive share (on the stack) and by self share (at the top of the stack); with
`--under FUNC` (a frame's start, e.g. "pump (vllm_voxserve"), what that function's time went to, one call level down.
"""

from __future__ import annotations

import argparse
import lzma
import re
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/", "vllm_voxserve/", "benchmarks/")


def short_frame(frame: str) -> str:
    """`func (path/to/pkg/mod.py)` -> `func (pkg/mod.py)`: the path from the package on."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for root in _PACKAGE_ROOTS:
        at = path.rfind(root)
        if at >= 0:
            path = path[at + len(root) if root.endswith("-packages/") else at:]
            break
    else:
        path = "/".join(path.split("/")[-2:])  # a module outside any package: its folder and name
    return f"{match['func']} ({path})"


def parse(text: str) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks by thread: {thread name: [(frames root first, samples)]}. A stack without a thread frame goes to '?'."""
    threads: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = "?"
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            thread = frames[0].split(": ", 1)[-1].strip() or frames[0]
            frames = frames[1:]
        threads[thread].append(([short_frame(f) for f in frames], int(count)))
    return threads


def shares(stacks: list[tuple[list[str], int]]) -> tuple[int, Counter, Counter]:
    """(samples, inclusive samples per function, self samples per function)."""
    total, inclusive, own = 0, Counter(), Counter()
    for frames, count in stacks:
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    return total, inclusive, own


def read_stacks(path: str | Path) -> str:
    path = Path(path)
    return lzma.open(path, "rt").read() if path.suffix == ".xz" else path.read_text()


def callees(stacks: list[tuple[list[str], int]], function: str) -> tuple[int, Counter]:
    """(samples of all, samples by what `function` (a frame's start; its outermost call) called, "<self>" for its
    own), in samples of the whole thread."""
    total, below = 0, Counter()
    for frames, count in stacks:
        total += count
        at = next((i for i, f in enumerate(frames) if f.startswith(function)), None)
        if at is not None:
            below[frames[at + 1] if at + 1 < len(frames) else "<self>"] += count
    return total, below


def report(path: str | Path, top: int = 30, thread: str | None = None, threads: int = 2,
           under: str | None = None) -> str:
    by_thread = parse(read_stacks(path))
    if not by_thread:
        return f"{path}: no samples"
    order = sorted(by_thread, key=lambda t: -sum(c for _, c in by_thread[t]))
    chosen = [thread] if thread else order[:threads]
    lines = [f"{path}: samples by thread: " + ", ".join(f"{t} {sum(c for _, c in by_thread[t])}" for t in order[:8])]
    for name in chosen:
        total, inclusive, own = shares(by_thread.get(name, []))
        if not total:
            continue
        if under:
            _, below = callees(by_thread[name], under)
            lines.append(f"\n{name}: {total} samples; under {under}")
            lines += [f"  {n / total:6.1%}  {f}" for f, n in below.most_common(top)]
            continue
        lines.append(f"\n{name}: {total} samples; functions by inclusive share")
        lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
        lines.append(f"{name}: by self share")
        lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", nargs="+")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--thread", default=None, help="only this thread (default: the busiest two)")
    parser.add_argument("--under", default=None, help="what this function called (a frame's start)")
    args = parser.parse_args(argv)
    for path in args.stacks:
        print(report(path, args.top, args.thread, under=args.under))


if __name__ == "__main__":
    main()
