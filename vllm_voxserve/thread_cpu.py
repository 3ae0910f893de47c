"""CPU time of each thread of this process between two reports: who competes with the step loop for the GIL, and
how busy the API server's threads are (`entrypoints/server_load.py`).

Runs 2026-12-01_530eabc and 2026-12-01_21d5739 on the H200: the lanes' harvest took 7-17 ms at p99 while nothing in it
should take 1 ms, and the step interval's p90 was twice the decode time. Every CUDA call of the step loop releases the
GIL; getting it back waits for whichever Python thread holds it (up to the 5 ms switch interval each time). This names
the busy threads. Linux only (`/proc/self/task`); elsewhere `report()` returns None.

`MachineCpu` says the same of the whole machine: how many CPUs were busy and what share the hypervisor gave to other
guests (steal); with `thread_preemptions`, each busy thread's line also says how often another task took its CPU.
Two server starts of one tree on the H200 (2026-12-04_4af55f2, starts 2 and 3) ran the same step's host work up to
twice as long at the same load, which no process-level reading tells apart from a slower or shared host.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

_TASKS = Path("/proc/self/task")
_STAT = Path("/proc/stat")


def thread_cpu_seconds(tasks: Path = _TASKS) -> dict[int, tuple[str, float]]:
    """{thread id: (name, user + system CPU seconds so far)}; Python threads by their `threading` name."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in tasks.iterdir():
        try:
            stat = (task / "stat").read_text()
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat(5)
        tid = int(task.name)
        out[tid] = (names.get(tid, comm), (int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return out


def thread_preemptions(tid: int, tasks: Path = _TASKS) -> int | None:
    """How often the kernel took the CPU from thread `tid` while it could still run (nonvoluntary context switches):
    other work on its CPU, where its own share of a CPU cannot tell waiting from working. None once it ended."""
    try:
        status = (tasks / str(tid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return None


class ThreadCpu:
    """`report()`: each thread's share of one CPU since the last call (busiest first, those above `min_share`), with
    how often a second it was preempted where `preemptions` reads that (`thread_preemptions`)."""

    def __init__(self, read: Callable[[], dict[int, tuple[str, float]]] = thread_cpu_seconds,
                 clock: Callable[[], float] = time.monotonic, min_share: float = 0.02,
                 preemptions: Callable[[int], int | None] | None = None) -> None:
        self.read, self.clock, self.min_share, self.preemptions = read, clock, min_share, preemptions
        try:
            self._last, self._at = read(), clock()
        except OSError:  # no /proc: nothing to report
            self._last, self._at = None, clock()
        self._preempted = self._preemption_counts(self._last or {})  # what the first report counts from

    def report(self) -> str | None:
        if self._last is None:
            return None
        now, at = self.read(), self.clock()
        wall, self._at = at - self._at, at
        if wall <= 0:
            return None
        counts, before = self._preemption_counts(now), self._preempted
        self._preempted = counts
        preempted = {tid: f" (preempted {(n - before[tid]) / wall:.0f}/s)"
                     for tid, n in counts.items() if tid in before}
        shares = []
        for tid, (name, seconds) in now.items():
            used = seconds - self._last.get(tid, (name, 0.0))[1]
            if used / wall >= self.min_share:
                shares.append((used / wall, name, tid, preempted.get(tid, "")))
        self._last = now
        shares.sort(reverse=True)
        return ", ".join(f"{name} ({tid}) {share:.0%}{extra}" for share, name, tid, extra in shares) or "none busy"

    def _preemption_counts(self, threads: dict[int, tuple[str, float]]) -> dict[int, int]:
        """Each thread's preemptions so far, where `preemptions` reads them (a thread gone meanwhile has none)."""
        if self.preemptions is None:
            return {}
        return {tid: n for tid in threads if (n := self.preemptions(tid)) is not None}


def machine_cpu_ticks(stat: Path = _STAT) -> tuple[int, int, int]:
    """(busy, stolen, total) clock ticks of all CPUs so far, from /proc/stat's first line: user, nice, system, idle,
    iowait, irq, softirq, steal (guest time is already inside user and nice)."""
    fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    fields += [0] * (8 - len(fields))
    total, idle, steal = sum(fields), fields[3] + fields[4], fields[7]
    return total - idle - steal, steal, total


class MachineCpu:
    """`report()`: since the last call, how many of the machine's CPUs were busy and the share stolen by the
    hypervisor ("5.2 of 16 CPUs busy, 0.4 % stolen"); None without /proc/stat."""

    def __init__(self, read: Callable[[], tuple[int, int, int]] = machine_cpu_ticks,
                 cpus: int | None = None) -> None:
        self.read, self.cpus = read, cpus or _stat_cpus() or os.cpu_count() or 1
        try:
            self._last: tuple[int, int, int] | None = read()
        except OSError:
            self._last = None

    def report(self) -> str | None:
        if self._last is None:
            return None
        now = self.read()
        busy, steal, total = (a - b for a, b in zip(now, self._last))
        self._last = now
        if total <= 0:
            return None
        return f"{self.cpus * busy / total:.1f} of {self.cpus} CPUs busy, {100 * steal / total:.1f} % stolen"


def _stat_cpus(stat: Path = _STAT) -> int:
    """The CPUs /proc/stat counts (its per-CPU lines): the ticks' own scale, where os.cpu_count may differ."""
    try:
        return sum(line[3:4].isdigit() for line in stat.read_text().splitlines() if line.startswith("cpu"))
    except OSError:
        return 0
