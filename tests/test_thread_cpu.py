"""ThreadCpu: each thread's CPU share between reports, from /proc (real) and from a fake reader (exact)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from vllm_voxserve.thread_cpu import ThreadCpu, thread_cpu_seconds


def test_shares_come_from_cpu_time_differences_over_wall_time():
    readings = iter([{1: ("MainThread", 10.0), 2: ("io", 5.0)},
                     {1: ("MainThread", 10.9), 2: ("io", 5.005), 3: ("late", 0.3)}])
    clock = iter([100.0, 101.0])
    cpu = ThreadCpu(read=lambda: next(readings), clock=lambda: next(clock))
    assert cpu.report() == "MainThread (1) 90%, late (3) 30%"  # io's 0.5 % is below the 2 % floor


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task is Linux's")
def test_a_spinning_python_thread_is_named_with_its_share():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, name="spinner")
    cpu = ThreadCpu()
    worker.start()
    try:
        time.sleep(0.5)
        line = cpu.report()
    finally:
        stop.set()
        worker.join()
    assert f"spinner ({worker.native_id})" in line
    assert threading.main_thread().native_id in thread_cpu_seconds()
