"""StepHostTimes (per-part percentiles over a window of steps) and DeviceStepTimer (device time per step)."""

from vllm_voxserve.step_host_times import StepHostTimes, percentile


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) in (50.0, 51.0)
    assert percentile(values, 0.99) == 99.0 and percentile(values, 1.0) == 100.0 and percentile(values, 0) == 1.0


def test_reports_each_part_and_the_total_once_per_window():
    lines = []
    ticks = iter([0.0, 0.010, 0.030, 0.060, 0.100])
    timer = StepHostTimes(every=4, report=lines.append, clock=lambda: next(ticks))
    timer.add_device_step("decode", 8, 0.004)
    timer.add_device_step("decode", 16, 0.006)
    timer.add_device_step("prefill", 100, 0.050)  # steps with a prompt are summarized apart
    timer.add_batch("urgent lane", 2, 0.003)
    timer.add_batch("urgent lane", 4, 0.005)
    for ms in (1, 2, 3, 4):
        timer.add_count("backbone frames", 3)
        timer.add_gauge("open audio streams", 10 * ms)
        timer.add("prepare", ms / 1000)
        timer.add("after", 2 * ms / 1000)
        timer.add("after", ms / 1000)  # a part timed twice in one step adds up
        assert (timer.end_step() is None) == (ms < 4)
    assert len(lines) == 1
    assert "over 4 steps" in lines[0]
    assert "prepare 3.000/4.000/4.000" in lines[0] or "prepare 2.000/4.000/4.000" in lines[0]
    assert "after 9.000/12.000/12.000" in lines[0] or "after 6.000/12.000/12.000" in lines[0]
    assert "total" in lines[0]
    assert "step interval 20.000/30.000/30.000" in lines[0] or "step interval 10.000/30.000/30.000" in lines[0]
    assert "decode device time" in lines[0] and "at mean batch 12.0" in lines[0]
    assert "prefill step device time 50.000/50.000/50.000 at mean 100 prompt tokens (33% of steps)" in lines[0]
    # 8 ms of lane work over the window's 60 ms of step intervals (10 + 20 + 30)
    assert "urgent lane 2 batches of mean 3.0, device time" in lines[0] and "busy 13%" in lines[0]
    assert "open audio streams 20/40/40" in lines[0] or "open audio streams 30/40/40" in lines[0]
    assert lines[0].endswith("; backbone frames 200/s")  # 12 frames over the window's 60 ms of step intervals
    timer.add("prepare", 0.001)
    assert timer.end_step() is None  # a new window started


def test_a_batchs_rows_with_padding_are_averaged_beside_its_size_where_they_are_given():
    lines = []
    timer = StepHostTimes(every=2, report=lines.append, clock=iter([0.0, 0.01, 0.02]).__next__)
    timer.add_batch("background lane", 9, 0.004, rows=12)
    timer.add_batch("background lane", 33, 0.009, rows=64)
    timer.add_batch("urgent lane", 2, 0.001)
    for _ in range(2):
        timer.add("prepare", 0.001)
        timer.end_step()
    assert "background lane 2 batches of mean 21.0 run as 38.0, device time" in lines[0]
    assert "urgent lane 1 batches of mean 2.0, device time" in lines[0]  # no rows given: no claim about them


def test_the_windows_longest_step_interval_and_when_it_ended_are_in_the_line():
    lines, now = [], [0.0]
    timer = StepHostTimes(every=600, report=lines.append, clock=lambda: now[0], every_s=1e9)
    for step in range(600):
        now[0] += 1.3 if step == 300 else 0.015  # one blocked step among 600: every percentile misses it
        timer.add("prepare", 0.001)
        timer.end_step()
    assert "step interval 15.000/15.000/15.000, longest 1300.0 ending 4.5 s before this line" in lines[0]
    for step in range(600):  # the next window starts its own longest
        now[0] += 0.05 if step == 599 else 0.015
        timer.add("prepare", 0.001)
        timer.end_step()
    assert "step interval 15.000/15.000/15.000, longest 50.0 ending 0.0 s before this line" in lines[1]


def test_the_longest_steps_own_parts_follow_it_so_time_outside_them_shows():
    lines, now = [], [0.0]
    timer = StepHostTimes(every=4, report=lines.append, clock=lambda: now[0], every_s=1e9)
    for step, (interval, prepare, after) in enumerate([(0.015, 0.001, 0.002), (0.090, 0.004, 0.003),
                                                        (0.015, 0.001, 0.002), (0.015, 0.030, 0.001)]):
        now[0] += interval
        timer.add("prepare", prepare)
        timer.add("after_forward", after)
        timer.end_step()
    # the 90 ms step's parts (7 ms of it), not the step with the largest part
    assert "longest 90.0 ending 0.0 s before this line (of it after_forward 3.0, prepare 4.0)" in lines[0]
    for step in range(4):  # the next window names its own longest step's parts only
        now[0] += 0.040 if step == 1 else 0.015
        timer.add("prepare", 0.002)
        timer.end_step()
    assert "longest 40.0 ending 0.0 s before this line (of it prepare 2.0)" in lines[1]


def test_a_window_also_closes_after_every_s_seconds_of_enough_steps():
    lines, now = [], [0.0]
    timer = StepHostTimes(every=2000, report=lines.append, clock=lambda: now[0], every_s=10.0, min_steps=20)
    closed_at = []
    for step in range(1, 121):
        now[0] += 0.25  # 4 steps a second
        timer.add("prepare", 0.001)
        if timer.end_step() is not None:
            closed_at.append(step)
    # the window opens at the first step's end: 40 more steps make 10 s; none of them is short of min_steps
    assert closed_at == [41, 81]
    assert "over 41 steps" in lines[0] and "over 40 steps" in lines[1]


class FakeEvent:
    """A timing event on a fake device clock: `record()` stamps the time; done once the clock passed it."""

    clock = {"now": 0.0, "done_until": 0.0}

    def record(self):
        self.at = self.clock["now"]

    def query(self):
        return self.at <= self.clock["done_until"]

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000.0  # ms, as torch.cuda.Event


def test_device_step_timer_reports_finished_steps_in_order_without_waiting():
    from vllm_voxserve.worker.step_timing import DeviceStepTimer

    clock = FakeEvent.clock
    clock.update(now=0.0, done_until=-1.0)
    timer = DeviceStepTimer(FakeEvent)
    for kind, size, seconds, rows in (("prefill", 300, 0.02, 7), ("decode", 8, 0.005, 0), ("decode", 9, 0.006, 0)):
        timer.start((kind, size, rows))
        clock["now"] += seconds
        timer.stop()
    assert timer.harvest() == []  # the device has not finished the first step yet
    clock["done_until"] = 0.025  # the first two are done
    assert [(step, round(t, 6)) for step, t in timer.harvest()] == [(("prefill", 300, 7), 0.02),
                                                                    (("decode", 8, 0), 0.005)]
    clock["done_until"] = 1.0
    assert [step for step, _ in timer.harvest()] == [("decode", 9, 0)]
    timer.stop()  # a stop without a start (a dummy step) records nothing
    assert timer.harvest() == []


def test_device_step_timer_measures_the_device_gap_before_each_step():
    from vllm_voxserve.worker.step_timing import DeviceStepTimer

    clock = FakeEvent.clock
    clock.update(now=10.0, done_until=100.0)
    timer = DeviceStepTimer(FakeEvent)
    for idle, busy in ((0.0, 0.008), (0.0003, 0.008), (0.002, 0.009), (5.0, 0.008)):  # 5 s: an idle server
        clock["now"] += idle
        timer.start(("decode", 64, 0))
        clock["now"] += busy
        timer.stop()
    assert len(timer.harvest()) == 4
    assert [round(g, 6) for g in timer.gaps] == [0.0003, 0.002]  # none before the first; the idle one left out
    lines = []
    host = StepHostTimes(every=1, report=lines.append)
    host.add_device_gap(0.0003)
    host.add("prepare", 0.0001)
    host.end_step()
    assert "device gap before a step 0.300/0.300/0.300" in lines[0]


def test_a_step_with_a_prompt_is_a_prefill_of_its_prompt_tokens_beside_its_decoding_rows():
    from vllm_voxserve.worker.runtime import _step_kind
    from vllm_voxserve.models.step_layout import StepLayout

    assert _step_kind(StepLayout(("a", "b", "c"), (1, 1, 1), (5, 9, 3))) == ("decode", 3, 0)
    assert _step_kind(StepLayout(("a", "n", "b", "m"), (1, 40, 1, 25), (5, 0, 9, 0))) == ("prefill", 65, 2)
    assert _step_kind(StepLayout(("n",), (40,), (0,))) == ("prefill", 40, 0)


def test_tallies_are_totals_of_the_window():
    lines = []
    timer = StepHostTimes(every=2, report=lines.append, clock=iter([0.0, 0.01, 0.02, 0.03, 0.04]).__next__)
    timer.add_tally("admission accepted", 3)
    timer.add("schedule", 0.001)
    timer.end_step()
    timer.add_tally("admission accepted", 2)
    timer.add_tally("admission refused: codec frames", 1)
    timer.add("schedule", 0.001)
    timer.end_step()
    assert lines[0].endswith("; admission accepted 5; admission refused: codec frames 1")
    for _ in range(2):
        timer.add("schedule", 0.001)
        timer.end_step()
    assert "admission" not in lines[1]  # a new window starts from zero
