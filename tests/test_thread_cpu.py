"""ThreadCpu: each thread's CPU share between reports, from /proc (real) and from a fake reader (exact)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from vllm_voxserve.thread_cpu import (
    MachineCpu,
    ThreadCpu,
    machine_cpu_ticks,
    thread_cpu_seconds,
    thread_preemptions,
)


def test_shares_come_from_cpu_time_differences_over_wall_time():
    readings = iter([{1: ("MainThread", 10.0), 2: ("io", 5.0)},
                     {1: ("MainThread", 10.9), 2: ("io", 5.005), 3: ("late", 0.3)}])
    clock = iter([100.0, 101.0])
    cpu = ThreadCpu(read=lambda: next(readings), clock=lambda: next(clock))
    assert cpu.report() == "MainThread (1) 90%, late (3) 30%"  # io's 0.5 % is below the 2 % floor


def test_preemptions_a_second_come_with_each_busy_thread_read_twice():
    readings = iter([{1: ("MainThread", 10.0), 2: ("io", 5.0)}, {1: ("MainThread", 10.9), 2: ("io", 5.5)}])
    clock = iter([100.0, 102.0])
    counts = {1: iter([100, 140]), 2: iter([7, None])}  # io's status file was gone at the second read
    cpu = ThreadCpu(read=lambda: next(readings), clock=lambda: next(clock),
                    preemptions=lambda tid: next(counts[tid]))
    assert cpu.report() == "MainThread (1) 45% (preempted 20/s), io (2) 25%"


def report_while_spinning(reader) -> tuple[str | None, threading.Thread]:
    """`reader.report()` after half a second of a Python thread spinning, and that thread."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, name="spinner")
    worker.start()
    try:
        time.sleep(0.5)
        return reader.report(), worker
    finally:
        stop.set()
        worker.join()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task is Linux's")
def test_a_spinning_python_thread_is_named_with_its_share():
    line, worker = report_while_spinning(ThreadCpu())
    assert f"spinner ({worker.native_id})" in line
    assert threading.main_thread().native_id in thread_cpu_seconds()
    assert thread_preemptions(threading.main_thread().native_id) >= 0 and thread_preemptions(-1) is None


def test_machine_busy_cpus_and_steal_come_from_tick_differences(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  1000 0 200 8000 100 0 0 50 300 0\ncpu0 1 2 3 4\ncpu1 1 2 3 4\nintr 5\n")
    assert machine_cpu_ticks(stat) == (1200, 50, 9350)
    readings = iter([(1200, 50, 9350), (2600, 60, 11350)])  # 2000 ticks: 1400 busy, 10 stolen
    cpu = MachineCpu(read=lambda: next(readings), cpus=4)
    assert cpu.report() == "2.8 of 4 CPUs busy, 0.5 % stolen"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_spinning_thread_shows_as_a_busy_cpu_of_the_machine():
    cpu = MachineCpu()
    line, _ = report_while_spinning(cpu)
    busy = float(line.split(" of ")[0])
    assert busy >= 0.5 and line.endswith("% stolen") and f"of {cpu.cpus} CPUs" in line
