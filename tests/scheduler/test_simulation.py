"""The discrete-event simulation (benchmarks/simulation) with the paper's costs reproduces its qualitative result.

Small windows keep this under a minute on a CPU, so the numbers are not the paper's protocol (60 s x 3 seeds, see
`python -m benchmarks.simulation`), only its ordering: deadline-aware admission serves more than prefill-first, and
past capacity deadline-aware admission alone collapses while our load shedding keeps goodput near its peak.
"""

import functools

import pytest

from benchmarks.simulation.server import SimulatedServer
from benchmarks.simulation.slo import STALL_THRESHOLD_S
from benchmarks.simulation.sweep import capacity, mode_config, peak_goodput, simulate_rate, sweep
from benchmarks.simulation.workload import load_word_counts, poisson_workload
from vllm_voxserve.scheduler.streams import schedule_of

WINDOW_S = 20.0
RATES = (32.0, 44.0, 56.0)

pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def results(mode):
    return sweep(mode, RATES, WINDOW_S, word_counts=load_word_counts())


@functools.lru_cache(maxsize=None)
def at_overload(mode):
    rate = 1.5 * capacity(results("deadline_aware"))
    return simulate_rate(mode, rate, WINDOW_S, word_counts=load_word_counts())


def test_deadline_aware_admission_raises_capacity_over_prefill_first():
    prefill_first, deadline_aware = capacity(results("prefill_first")), capacity(results("deadline_aware"))
    assert deadline_aware > prefill_first > 0


def test_past_capacity_shedding_keeps_goodput_while_deadline_aware_alone_collapses():
    shed, alone = at_overload("deadline_aware_shed"), at_overload("deadline_aware")
    shed_peak = max(peak_goodput(results("deadline_aware_shed")), shed.goodput)
    alone_peak = max(peak_goodput(results("deadline_aware")), alone.goodput)
    assert shed.goodput >= 0.9 * shed_peak
    assert alone.goodput < 0.5 * alone_peak
    assert shed.rejected > 0 and alone.rejected == 0
    # shedding does not cost capacity below the overload point
    assert capacity(results("deadline_aware_shed")) >= capacity(results("deadline_aware"))


class InvariantChecks:
    """Wraps a server's planner and checks every plan against the stream states it was made from."""

    def __init__(self, server):
        self.server = server
        self.plan_step = server.planner.plan_step
        server.planner.plan_step = self.checked_plan_step
        self.deferral_spans, self.deferring_since, self.plans = [], None, 0

    def checked_plan_step(self, now, streams, waiting, lanes, lm_free=True):
        urgent_was_idle, background_was_idle = not lanes.urgent_busy, not lanes.background_busy
        plan = self.plan_step(now, streams, waiting, lanes, lm_free)
        self.plans += 1
        by_id = {s.request_id: s for s in streams}
        launched = plan.urgent + plan.background
        assert len({c.request_id for c in launched}) == len(launched), "two chunks of one request at once"
        for chunk in launched:  # chunks stay in order: only a request's next chunk, none in flight
            s = by_id[chunk.request_id]
            assert chunk.index == s.next_chunk and not s.chunk_in_flight
        assert all(c.index > 0 for c in plan.background), "a first chunk joined background work"
        assert plan.urgent == [] or urgent_was_idle
        assert plan.background == [] or background_was_idle
        if urgent_was_idle:  # a ready first chunk never waits while the urgent lane is idle
            first = [s for s in streams if s.next_chunk == 0 and not s.chunk_in_flight and s.frames_generated >= 10]
            assert len(plan.urgent) == self.server.cfg.urgent_max_batch or all(
                (s.request_id, 0) in {(c.request_id, c.index) for c in plan.urgent} for s in first
            )
        since = self.server.planner.admission.deferring_since
        if self.deferring_since is not None and since != self.deferring_since:
            self.deferral_spans.append(now - self.deferring_since)
        self.deferring_since = since
        return plan


@pytest.mark.parametrize(
    "mode, rate", [("deadline_aware", 84.0), ("deadline_aware_shed", 84.0), ("prefill_first", 50.0)]
)
def test_simulated_runs_keep_the_rules(mode, rate):
    cfg = mode_config(mode)
    server = SimulatedServer(cfg, seed=1)
    checks = InvariantChecks(server)
    requests = poisson_workload(rate, 12.0, seed=1, word_counts=load_word_counts())
    outcomes = server.run(requests, horizon_s=120.0)
    assert checks.plans > 500
    schedule = schedule_of(cfg)
    for request, outcome in zip(requests, outcomes):
        if outcome.completed:  # every chunk arrived once, in order, with the request's audio
            assert len(outcome.audio) == schedule.num_chunks(request.frames)
            assert sum(seconds for _, seconds in outcome.audio) == pytest.approx(request.frames * 0.08)
            assert [t for t, _ in outcome.audio] == sorted(t for t, _ in outcome.audio)
        else:
            assert outcome.rejected
    # no prefill deferred more than 100 ms in a row (plans happen at LM step boundaries)
    assert max(checks.deferral_spans, default=0.0) <= cfg.max_prefill_deferral_s + 1e-9
    if mode == "deadline_aware":
        assert len(checks.deferral_spans) > 10  # the overload did make it defer
    assert STALL_THRESHOLD_S == 0.010


def test_with_the_hand_over_at_the_step_first_audio_waits_for_the_lm_step_and_its_way_is_reported():
    from benchmarks.simulation.server import GpuModel

    server = SimulatedServer(mode_config("deadline_aware_shed"), GpuModel(handover_at_step=True), seed=1)
    step_ends, handovers = set(), []
    lm_done, observe = server._on_lm_done, server.planner.observe
    server._on_lm_done = lambda now, step: (step_ends.add(now), lm_done(now, step))
    server.planner.observe = lambda report: (handovers.extend(report.first_audio_handovers), observe(report))
    outcomes = server.run(poisson_workload(40.0, 5.0, seed=1, word_counts=load_word_counts()), horizon_s=60.0)
    firsts = [o.audio[0][0] for o in outcomes if o.audio]
    assert len(handovers) == len(firsts) > 100  # one way to audio a first audio
    # a first chunk's batch ends within the next LM step, which it then waits for (or the LM was idle)
    assert sum(t in step_ends for t in firsts) > 0.9 * len(firsts)
    decode_s = server.gpu.seed.urgent_codec(1)
    assert min(handovers) > 0.8 * decode_s and sum(handovers) / len(handovers) > 2 * decode_s


def test_each_codec_batch_lengthens_the_next_lm_step_by_its_host_time_and_is_counted():
    from benchmarks.simulation.server import GpuModel

    gpu = GpuModel(host_per_codec_batch_s=0.002, urgent_interference=0.0)
    server = SimulatedServer(mode_config("deadline_aware_shed"), gpu, seed=1)
    pending, debts = [0], []
    launch_codec, launch_lm = server._launch_codec, server._launch_lm

    def on_codec(now, batch, kind, done):
        pending[0] += 1
        launch_codec(now, batch, kind, done)

    def on_lm(now, admit, decode):
        debt = server.lm_debt_s
        launch_lm(now, admit, decode)
        if server.lm_busy and server.lm_debt_s == 0.0:  # this step took the debt
            debts.append((debt, 0.002 * pending[0]))
            pending[0] = 0

    server._launch_codec, server._launch_lm = on_codec, on_lm
    outcomes = server.run(poisson_workload(40.0, 5.0, seed=1, word_counts=load_word_counts()), horizon_s=60.0)
    assert sum(1 for debt, _ in debts if debt > 0) > 100
    assert all(debt == pytest.approx(expected) for debt, expected in debts)
    batches = server.codec_batches
    assert batches["urgent_batches"] > 0 and batches["background_batches"] > 0
    delivered = sum(len(o.audio) for o in outcomes)
    assert batches["urgent_chunks"] + batches["background_chunks"] == delivered  # each chunk in one batch


def test_a_background_batch_costs_the_graph_it_pads_up_to_and_reports_its_own_size():
    from benchmarks.simulation.server import GpuModel

    buckets = (1, 2, 4, 8, 16, 32, 64)
    padded = SimulatedServer(mode_config("deadline_aware_shed"), GpuModel(jitter=0.0, background_buckets=buckets))
    plain = SimulatedServer(mode_config("deadline_aware_shed"), GpuModel(jitter=0.0))
    assert padded._run_cost("background_codec", 33) == pytest.approx(plain._run_cost("background_codec", 64))
    assert padded._run_cost("background_codec", 32) == pytest.approx(plain._run_cost("background_codec", 32))
    assert padded._run_cost("urgent_codec", 3) == pytest.approx(plain._run_cost("urgent_codec", 3))  # not padded
    assert [s.size for s in padded.samples] == [33, 32, 3]
    assert plain._run_cost("background_codec", 33) < plain._run_cost("background_codec", 64)


def test_with_the_codec_at_the_step_batches_launch_only_between_lm_steps():
    from benchmarks.simulation.server import GpuModel

    server = SimulatedServer(mode_config("deadline_aware_shed"), GpuModel(codec_at_step=True), seed=1)
    busy_at_launch = []
    launch_codec = server._launch_codec

    def on_codec(now, batch, kind, done):
        busy_at_launch.append(server.lm_busy)
        launch_codec(now, batch, kind, done)

    server._launch_codec = on_codec
    outcomes = server.run(poisson_workload(40.0, 5.0, seed=1, word_counts=load_word_counts()), horizon_s=60.0)
    assert len(busy_at_launch) > 100 and not any(busy_at_launch)
    assert all(o.completed or o.rejected for o in outcomes)
