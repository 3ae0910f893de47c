"""StepHostTimes: per-part percentiles over a window of steps, then a fresh window."""

from vllm_voxserve.worker.host_timing import StepHostTimes, percentile


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) in (50.0, 51.0)
    assert percentile(values, 0.99) == 99.0 and percentile(values, 1.0) == 100.0 and percentile(values, 0) == 1.0


def test_reports_each_part_and_the_total_once_per_window():
    lines = []
    timer = StepHostTimes(every=4, report=lines.append)
    for ms in (1, 2, 3, 4):
        timer.add("prepare", ms / 1000)
        timer.add("after", 2 * ms / 1000)
        timer.add("after", ms / 1000)  # a part timed twice in one step adds up
        assert (timer.end_step() is None) == (ms < 4)
    assert len(lines) == 1
    assert "over 4 steps" in lines[0]
    assert "prepare 3.000/4.000/4.000" in lines[0] or "prepare 2.000/4.000/4.000" in lines[0]
    assert "after 9.000/12.000/12.000" in lines[0] or "after 6.000/12.000/12.000" in lines[0]
    assert "total" in lines[0]
    timer.add("prepare", 0.001)
    assert timer.end_step() is None  # a new window started
