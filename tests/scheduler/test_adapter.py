"""The policy inside a real vLLM `Scheduler` / `AsyncScheduler` on CPU: fake clock, fake model runner outputs.

Step tables: each engine step is schedule() at time t, then update_from_output() at t + step (sampling one token per
request whose prompt is done), as vLLM's engine core does.
"""

from __future__ import annotations

import queue
import types

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from benchmarks.cpu_scheduler import FakeClock, cpu_scheduler  # noqa: E402
from vllm_voxserve.compat import STEP_REPORT_ATTR, attach_step_report  # noqa: E402
from vllm_voxserve.config import as_additional_config  # noqa: E402
from vllm_voxserve.contract import RequestProgress, StepReport, decode_failure, decode_rejection  # noqa: E402
from vllm_voxserve.fault_injection import REFUSE_ENV  # noqa: E402
from vllm_voxserve.scheduler.adapter import SpeechAsyncScheduler, SpeechScheduler  # noqa: E402
from vllm_voxserve.scheduler.costs import CostModel, CostSeed, LinearCost  # noqa: E402
from vllm_voxserve.scheduler.planner import Planner  # noqa: E402
from vllm_voxserve.step_host_times import StepHostTimes  # noqa: E402

STEP_S = 0.015  # every fake step takes this long, and the cost model says so
PREFILL_S = 0.08  # a prefill costs more than a running stream's slack (≈ 33 ms below)
BLOCKS = 2000


@pytest.fixture(autouse=True)
def v1_runner_rules(monkeypatch):
    """The scheduler's rules for the V1 model runner (what runs on CPU), wherever these tests run."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")


def build(policy: dict | None = None, async_scheduling: bool = False, max_num_seqs: int = 16, **voxserve):
    policy = {"overload_mode": "off", **(policy or {})}
    # the step tables below assume the paper's 10-frame first chunk; fields that are not settings
    # (admission_mode ...) go to the internal section
    additional_config = as_additional_config({"first_chunk_frames": 10, "scheduler": policy, **voxserve})
    scheduler, clock = cpu_scheduler(additional_config, max_num_seqs, BLOCKS, async_scheduling)
    seed = CostSeed(decode=LinearCost(STEP_S, 0.0), prefill=LinearCost(PREFILL_S, 0.0),
                    urgent_codec=LinearCost(0.002, 0.0), background_codec=LinearCost(0.005, 0.0))
    scheduler.planner = Planner(scheduler.speech_policy, CostModel(seed))
    return scheduler, clock


def speech_request(rid: str, clock: FakeClock, prompt: int = 20, max_tokens: int = 200, **job) -> Request:
    params = SamplingParams(max_tokens=max_tokens, extra_args={"voxserve": {"fixed_length": True, **job}})
    return Request(rid, [0] * prompt, params, None, arrival_time=clock.t)


def step(scheduler, clock: FakeClock, report: StepReport | None = None):
    """One engine step; returns (scheduled request ids, newly prefilled ids, engine outputs)."""
    out = scheduler.schedule()
    clock.t += STEP_S
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        request = scheduler.requests[rid]
        done = request.num_computed_tokens >= request.num_prompt_tokens  # already advanced by schedule()
        sampled.append([1] if done else [])
    output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=sampled)
    if report is not None:
        attach_step_report(output, lambda: report)
    engine_outputs = scheduler.update_from_output(out, output)
    return set(ids), {r.req_id for r in out.scheduled_new_reqs}, engine_outputs


def test_factory_picks_the_scheduler_vllm_would():
    assert type(build()[0]) is SpeechScheduler
    assert type(build(async_scheduling=True)[0]) is SpeechAsyncScheduler


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prefill_deferred_while_a_stream_is_short_of_slack_then_admitted_within_100_ms(async_scheduling):
    # the running request's slack decides (b's own first chunk is past saving here, so its deadline does not count:
    # test_planner's cases)
    scheduler, clock = build(async_scheduling=async_scheduling)
    scheduler.add_request(speech_request("a", clock))
    for _ in range(2):
        step(scheduler, clock)  # a: prefill, then its first decode
    arrival = clock.t
    scheduler.add_request(speech_request("b", clock))
    # a's slack stays ≈ 33 ms (its steps run as predicted), short of b's 80 ms prefill
    table = []
    while "b" not in scheduler.streams:
        scheduled, new, _ = step(scheduler, clock)
        table.append((round(clock.t - STEP_S - arrival, 3), sorted(scheduled), sorted(new)))
        assert len(table) < 20
    deferred = [row for row in table if row[2] == []]
    admitted_at = table[-1][0]
    assert [row[1] for row in deferred] == [["a"]] * len(deferred)  # a kept decoding meanwhile
    assert len(deferred) >= 5  # held back over several steps ...
    assert admitted_at <= scheduler.speech_policy.max_prefill_deferral_s  # ... but at most 100 ms in a row
    assert table[-1][2] == ["b"]
    assert scheduler.get_num_unfinished_requests() == 2  # held requests stayed visible to the engine


def test_held_request_is_back_in_vllms_waiting_queue_between_steps():
    scheduler, clock = build()
    scheduler.add_request(speech_request("a", clock))
    step(scheduler, clock)
    step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))
    scheduled, new, _ = step(scheduler, clock)
    assert new == set() and "b" in scheduler.held
    assert [r.request_id for r in scheduler.waiting] == ["b"]


def test_prefill_first_admits_at_once():
    scheduler, clock = build({"admission_mode": "prefill_first"})
    scheduler.add_request(speech_request("a", clock))
    step(scheduler, clock)
    step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))
    scheduled, new, _ = step(scheduler, clock)
    assert new == {"b"} and scheduled == {"a", "b"}


def test_prefill_first_switched_on_live_admits_at_once_and_the_configured_mode_comes_back():
    """`lanes+prefill_first` on a deadline-aware server (serving_mode.py): the same costs, the other admission."""
    scheduler, clock = build()
    costs = scheduler.planner.costs
    scheduler.set_policy(stock=False, admission_mode="prefill_first")
    assert scheduler.admission_mode == "prefill_first" and scheduler.planner.costs is costs
    scheduler.add_request(speech_request("a", clock))
    step(scheduler, clock)
    step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))
    assert step(scheduler, clock)[1] == {"b"}  # deferred under the configured mode (the test above)
    with pytest.raises(RuntimeError, match="no request"):
        scheduler.set_policy(stock=False)
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    step(scheduler, clock)
    scheduler.set_policy(stock=False)
    assert scheduler.admission_mode == scheduler.configured_admission_mode == "deadline_aware"
    scheduler.add_request(speech_request("c", clock))
    step(scheduler, clock)
    step(scheduler, clock)
    scheduler.add_request(speech_request("d", clock))
    assert step(scheduler, clock)[1] == set() and "d" in scheduler.held


def test_idle_server_admits_at_once_in_deadline_mode():
    scheduler, clock = build()
    scheduler.add_request(speech_request("a", clock))
    assert step(scheduler, clock)[1] == {"a"}


def _three_streams(mode: str):
    scheduler, clock = build({"admission_mode": mode, "max_decode_batch": 2})
    for rid in "abc":
        scheduler.add_request(speech_request(rid, clock))
        clock.t += 0.001
    scheduled, new, _ = step(scheduler, clock)  # idle: all three prefill together
    assert new == {"a", "b", "c"}
    now = clock.t
    # a and b have played their first chunk; a's is nearly over, b's just started; c has no audio yet
    report = StepReport(now, [RequestProgress("a", 15, False, 1, 0.8, first_audio_time=now - 0.7),
                              RequestProgress("b", 12, False, 1, 0.8, first_audio_time=now),
                              RequestProgress("c", 0, False, 0, 0.0)])
    step(scheduler, clock, report)  # decode step with the report (3 running > batch of 2)
    return scheduler, clock


def test_decode_batch_takes_least_slack_first():
    scheduler, clock = _three_streams("deadline_aware")
    scheduled, _, _ = step(scheduler, clock)
    assert scheduled == {"a", "c"}  # b has the most audio buffered
    assert len(scheduler.running) == 3  # b is only left out of this step


def test_prefill_first_decodes_in_arrival_order():
    scheduler, clock = _three_streams("prefill_first")
    scheduled, _, _ = step(scheduler, clock)
    assert scheduled == {"a", "b"}


def test_per_request_slo_moves_the_first_chunk_deadline():
    scheduler, clock = build()
    scheduler.add_request(speech_request("strict", clock, ttfa_slo_ms=100))
    scheduler.add_request(speech_request("loose", clock, ttfa_slo_ms=1000))
    scheduler.add_request(speech_request("default", clock))
    held = scheduler.held
    assert held["strict"].arrival_time == pytest.approx(clock.t - 0.1)
    assert held["loose"].arrival_time == pytest.approx(clock.t + 0.8)
    assert held["default"].arrival_time == pytest.approx(clock.t)
    assert held["default"].expected_frames == 199  # fixed length: max_tokens - 1 frames


def test_overloaded_arrival_is_finished_with_a_rejection_the_endpoint_can_read():
    scheduler, clock = build({"overload_mode": "reject"})
    scheduler.add_request(speech_request("a", clock))
    assert step(scheduler, clock)[1] == {"a"}  # idle: admitted although T is out of reach (nothing to shed)
    # 10 steps of 15 ms + an 80 ms prefill cannot reach first audio within 200 ms once the server is busy
    scheduler.add_request(speech_request("b", clock))
    assert [r.request_id for r, _ in scheduler.rejected] == ["b"] and "b" not in scheduler.requests  # finished
    scheduled, new, outputs = step(scheduler, clock)
    assert "b" not in scheduled and "b" not in scheduler.requests
    [rejected] = [o for eco in outputs.values() for o in eco.outputs if o.request_id == "b"]
    assert rejected.finish_reason == FinishReason.ABORT
    rejection = decode_rejection(rejected.stop_reason)
    assert rejection.retry_after_s >= 1.0 and "first audio" in rejection.reason
    assert not rejection.by_limit  # a prediction for this request, not a count: the API server keeps no mark
    assert step(scheduler, clock)[0] == {"a"}  # a is unaffected


def test_the_test_refusal_refuses_its_seed_on_its_rank_only(monkeypatch):
    monkeypatch.setenv(REFUSE_ENV, "0:7")
    scheduler, clock = build()  # overload shedding off: only the test refusal refuses
    assert scheduler.rank == 0
    scheduler.add_request(speech_request("other", clock, seed=8))
    scheduler.add_request(speech_request("refused", clock, seed=7))
    assert [r.request_id for r, _ in scheduler.rejected] == ["refused"] and "other" in scheduler.held
    _, _, outputs = step(scheduler, clock)
    [rejected] = [o for eco in outputs.values() for o in eco.outputs if o.request_id == "refused"]
    assert "rank 0 refused it" in decode_rejection(rejected.stop_reason)[1]
    monkeypatch.setenv(REFUSE_ENV, "1:7")
    scheduler, clock = build()
    scheduler.add_request(speech_request("served", clock, seed=7))
    assert not scheduler.rejected and "served" in scheduler.held


def test_an_arrival_refusal_is_on_the_engine_cores_output_queue_before_any_step(monkeypatch):
    """The engine core (with its output queue, as in a served engine-core process) answers a refusal as it arrives,
    and the next step does not answer it again."""
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setenv(REFUSE_ENV, "0:7")
    scheduler, clock = build()  # building it installs `compat.answer_refusals_at_arrival`, as in the engine core
    core = EngineCore.__new__(EngineCore)
    core.scheduler, core.output_queue = scheduler, queue.Queue()
    core.add_request(speech_request("served", clock, seed=8))
    core.add_request(speech_request("refused", clock, seed=7))
    client_index, answer = core.output_queue.get_nowait()
    assert core.output_queue.empty() and client_index == 0
    [refusal] = answer.outputs
    assert refusal.request_id == "refused" and refusal.finish_reason == FinishReason.ABORT
    assert "rank 0 refused it" in decode_rejection(refusal.stop_reason)[1]
    _, new, outputs = step(scheduler, clock)
    assert new == {"served"} and not any(o.request_id == "refused" for eco in outputs.values() for o in eco.outputs)


def test_requests_without_a_speech_job_pass_through():
    scheduler, clock = build()
    scheduler.add_request(Request("warmup", [0] * 8, SamplingParams(max_tokens=4), None, arrival_time=clock.t))
    assert step(scheduler, clock)[1] == {"warmup"}
    assert not scheduler.streams and not scheduler.held


def test_a_request_with_a_looser_slo_is_accepted_where_the_server_default_is_rejected():
    scheduler, clock = build({"overload_mode": "reject"})
    scheduler.add_request(speech_request("a", clock))
    step(scheduler, clock)
    scheduler.add_request(speech_request("strict", clock))  # the server's 200 ms: first audio at ≈ 232 ms misses
    scheduler.add_request(speech_request("loose", clock, ttfa_slo_ms=1000))
    assert [r.request_id for r, _ in scheduler.rejected] == ["strict"] and "loose" in scheduler.held
    step(scheduler, clock)
    assert "loose" in scheduler.streams or "loose" in scheduler.held  # not shed while it can still make 1 s


def test_attach_report_reaches_the_output_an_async_output_will_return():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    def real():
        return ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})

    report = StepReport(1.0)
    plain, mrv2, v1_async = real(), types.SimpleNamespace(model_runner_output=real()), types.SimpleNamespace()
    v1_async._model_runner_output = real()
    for output, target in ((plain, plain), (mrv2, mrv2.model_runner_output), (v1_async, v1_async._model_runner_output)):
        attach_step_report(output, lambda: report)
        assert getattr(target, STEP_REPORT_ATTR) is report
    attach_step_report(EMPTY_MODEL_RUNNER_OUTPUT, lambda: report)  # shared by every empty step: left alone
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, STEP_REPORT_ATTR)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stock_mode_runs_vllms_policy_untouched_and_switches_only_when_idle(async_scheduling):
    """The `vllm-stock` serving mode: where our policy defers b's prefill, vLLM's schedules it at once."""
    scheduler, clock = build(async_scheduling=async_scheduling)
    scheduler.set_policy(stock=True)
    scheduler.add_request(speech_request("a", clock))
    for _ in range(2):
        step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))
    scheduled, new, _ = step(scheduler, clock)
    assert new == {"b"} and scheduled == {"a", "b"}  # deferred under our policy (the test above)
    assert not scheduler.streams and not scheduler.held  # the policy saw nothing
    assert scheduler.has_requests()
    with pytest.raises(RuntimeError, match="no request"):
        scheduler.set_policy(stock=False)
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    step(scheduler, clock)
    scheduler.set_policy(stock=False)
    scheduler.add_request(speech_request("c", clock))
    assert "c" in scheduler.held or "c" in scheduler.streams  # the policy is back


def test_a_request_waits_while_every_codec_slot_holds_an_open_audio_stream():
    scheduler, clock = build({"admission_mode": "prefill_first"}, max_codec_slots=2)
    scheduler.add_request(speech_request("a", clock, max_tokens=3))
    scheduler.add_request(speech_request("b", clock, max_tokens=100))
    both = StepReport(clock.t, [RequestProgress("a", 2, True, 0, 0.0), RequestProgress("b", 2, False, 0, 0.0)])
    while "a" in scheduler.requests:
        step(scheduler, clock, both)
    # vLLM is done with a, but the worker still decodes its audio while b generates: both slots are taken
    scheduler.add_request(speech_request("c", clock))
    for _ in range(3):
        assert step(scheduler, clock, both)[1] == set()
    assert "c" in scheduler.held
    step(scheduler, clock, StepReport(clock.t, [RequestProgress("b", 5, False, 0, 0.0)]))  # a's audio ended
    assert step(scheduler, clock)[1] == {"c"}


def test_finished_requests_whose_audio_still_decodes_count_for_admission_until_the_worker_ends_them():
    scheduler, clock = build({"admission_mode": "prefill_first"})
    scheduler.add_request(speech_request("a", clock, max_tokens=3))
    scheduler.add_request(speech_request("b", clock, max_tokens=100))
    both = StepReport(clock.t, [RequestProgress("a", 2, False, 0, 0.0), RequestProgress("b", 2, False, 0, 0.0)])
    while "a" in scheduler.requests:
        step(scheduler, clock, both)
    # vLLM is done with a; the worker reports it open (its last chunk not decoded): admission still sees it
    assert set(scheduler.draining) == {"a"} and scheduler.draining["a"].generation_done
    seen = []
    scheduler.planner.on_arrival = lambda now, request, streams, waiting: seen.append({s.request_id for s in streams})
    scheduler.add_request(speech_request("c", clock))
    assert seen == [{"a", "b"}]
    step(scheduler, clock, StepReport(clock.t, [RequestProgress("b", 5, False, 0, 0.0)]))  # a's audio ended
    assert scheduler.draining == {}


def test_with_nothing_generating_the_last_reports_streams_do_not_hold_arrivals():
    """No step runs while nothing generates, so no report says the worker's streams ended (its lanes drain them
    before its next forward): the stale count must not hold a new request for good."""
    scheduler, clock = build({"admission_mode": "prefill_first"}, max_codec_slots=2)
    for rid in "ab":
        scheduler.add_request(speech_request(rid, clock, max_tokens=3))
    decoding = StepReport(clock.t, [RequestProgress(r, 1, False, 0, 0.0) for r in "ab"])
    while any(r in scheduler.requests for r in "ab"):
        step(scheduler, clock, decoding)
    assert scheduler.audio_streams == {"a", "b"}  # as the last real step reported
    scheduler.add_request(speech_request("c", clock))
    assert step(scheduler, clock)[1] == {"c"}

@pytest.mark.parametrize("stock", [False, True])
def test_the_policys_host_time_is_logged_each_window_in_either_mode(stock):
    """schedule and update host seconds a step, and the admitted streams, as the worker's step log has its parts;
    in `vllm-stock` mode the same line gives vLLM's own policy's time."""
    scheduler, clock = build()
    lines = []
    scheduler.host_times = StepHostTimes(every=3, report=lines.append, title="voxserve scheduler host time")
    scheduler.set_policy(stock=stock)
    scheduler.add_request(speech_request("a", clock))
    for _ in range(3):
        step(scheduler, clock)
    assert len(lines) == 1 and lines[0].startswith("voxserve scheduler host time over 3 steps")
    assert "schedule " in lines[0] and "update " in lines[0]
    assert ("admitted streams 1/1/1" in lines[0]) == (not stock)  # the policy admits nothing in stock mode
    # with the policy, what admission decided and its capacity estimates in frames/s per lane
    assert ("capacity backbone frames/s" in lines[0] and "capacity codec frames/s" in lines[0]) == (not stock)


def test_admission_decisions_reach_the_log_line():
    scheduler, clock = build({"overload_mode": "reject"})
    lines = []
    scheduler.host_times = StepHostTimes(every=4, report=lines.append, title="voxserve scheduler host time")
    scheduler.add_request(speech_request("a", clock))  # an idle server takes it unchecked
    step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))  # checked: the server is busy
    for _ in range(3):
        step(scheduler, clock)
    # b's first chunk cannot come within T at these step costs (ten steps of STEP_S): refused at arrival, counted
    assert "admission refused: first audio late 1" in lines[0] and "demand % of codec" in lines[0]


def test_how_long_a_request_took_to_reach_the_engine_is_logged():
    scheduler, clock = build()
    lines = []
    scheduler.host_times = StepHostTimes(every=2, report=lines.append, title="voxserve scheduler host time")
    late = speech_request("a", clock)
    late.arrival_time = clock.t - 0.034  # the API server held it 34 ms before the engine core saw it
    scheduler.add_request(late)
    scheduler.add_request(speech_request("b", clock))
    for _ in range(2):
        step(scheduler, clock)
    assert "arrival age ms 0/34/34" in lines[0]


@pytest.mark.parametrize("stock", [False, True])
def test_how_long_a_request_waited_from_its_arrival_to_its_prefill_is_logged_in_either_mode(stock):
    scheduler, clock = build()
    scheduler.set_policy(stock=stock)
    lines = []
    scheduler.host_times = StepHostTimes(every=3, report=lines.append, title="voxserve scheduler host time")
    late = speech_request("a", clock)
    late.arrival_time = clock.t - 0.034  # 34 ms on its way before the engine core saw it
    scheduler.add_request(late)
    step(scheduler, clock)
    scheduler.add_request(speech_request("b", clock))
    clock.t += 0.02  # b waits 20 ms before a step schedules it
    for _ in range(2):
        step(scheduler, clock)
    assert "arrival to prefill ms 20/34/34" in lines[0]  # one value a prompt, not one a step


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_the_worker_failed_ends_at_once_with_its_error(async_scheduling):
    scheduler, clock = build(async_scheduling=async_scheduling)
    for rid in "ab":
        scheduler.add_request(speech_request(rid, clock))
    step(scheduler, clock)
    step(scheduler, clock)
    report = StepReport(clock.t, [RequestProgress("a", 1, False, 0, 0.0)], failed={"b": "codec failed: boom"})
    _, _, outputs = step(scheduler, clock, report)
    ended = [o for out in outputs.values() for o in out.outputs if o.finish_reason is not None]
    assert [(o.request_id, o.finish_reason, decode_failure(o.stop_reason)) for o in ended] \
        == [("b", FinishReason.ERROR, "codec failed: boom")]
    assert "b" not in scheduler.requests and "b" not in scheduler.streams  # its KV blocks are free
    assert step(scheduler, clock, report)[0] == {"a"}  # a report naming it again changes nothing
    assert scheduler.requests["a"].status == RequestStatus.RUNNING
