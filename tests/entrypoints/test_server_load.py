"""The API server's load line on a simulated clock: the loop's lag quantiles over a window, the threads' CPU shares,
the window's garbage collections."""

import asyncio
import logging

from vllm_voxserve.entrypoints.server_load import ServerLoad, log_server_load
from vllm_voxserve.gc_pauses import GcPauses
from vllm_voxserve.thread_cpu import ThreadCpu


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def collections() -> GcPauses:
    """Collections on a clock of their own, fed by hand (not installed: the process's own stay out)."""
    return GcPauses(clock=Clock())


def collect(pauses: GcPauses, generation: int, seconds: float) -> None:
    pauses._on_gc("start", {"generation": generation})
    pauses.clock.now += seconds
    pauses._on_gc("stop", {"generation": generation})


def test_a_window_reports_the_lag_quantiles_the_busy_threads_and_the_collections():
    clock = Clock()
    cpu = {1: ("MainThread", 0.0)}
    pauses = collections()
    load = ServerLoad(window_s=10.0, clock=clock, threads=ThreadCpu(read=lambda: dict(cpu), clock=clock),
                      gc_pauses=pauses)
    lines = []
    for i in range(200):  # 0.05 s ticks: 198 on time, one 40 ms late, one 300 ms late (an old generation's pause)
        clock.now += 0.05
        if i == 120:
            collect(pauses, 2, 0.3)
        cpu[1] = ("MainThread", 8.5 * clock.now / 10.0)  # 85 % of a CPU
        lines.append(load.lag({50: 0.04, 120: 0.3}.get(i, 0.0)))
    assert lines[:199] == [None] * 199
    assert lines[199] == ("event loop lag ms p50/p99/max 0.0/40.0/300.0 over 200 ticks; "
                          "threads, share of a CPU: MainThread (1) 85%; "
                          "gc collections: gen2 1 (300.0 ms total, max 300.00 ms)")
    clock.now += 0.05
    assert load.lag(0.001) is None  # a new window starts
    clock.now += 10.0
    assert load.lag(0.0).endswith("; gc collections: none")  # each window its own


def test_the_first_audios_handed_on_in_a_window_follow_the_lag_and_a_window_without_any_says_nothing_of_them():
    clock, taken = Clock(), [[0.12, 0.09, 0.23, 0.1], []]
    load = ServerLoad(window_s=1.0, clock=clock, threads=ThreadCpu(read=dict, clock=clock),
                      first_audio_s=lambda: taken.pop(0), gc_pauses=collections())
    lines = []
    for _ in range(40):
        clock.now += 0.05
        lines.append(load.lag(0.0))
    reported = [line for line in lines if line is not None]
    assert len(reported) == 2
    assert reported[0].endswith("; first audio handed on ms p50/p99/max 120.0/230.0/230.0 over 4 requests")
    assert "first audio" not in reported[1]


def test_the_server_logs_its_load_while_it_runs(caplog):
    async def run():
        task = asyncio.get_running_loop().create_task(log_server_load(tick_s=0.01, window_s=0.05))
        await asyncio.sleep(0.2)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="vllm_voxserve.entrypoints.server_load"):
        asyncio.run(run())
    assert "voxserve api server load: event loop lag ms p50/p99/max" in caplog.text
    assert "; gc collections: " in caplog.text
