"""vLLM scheduler subclasses that apply the speech policy (`Planner`) around `super().schedule()`.

The engine core's adapter: it imports the pure policy, never the worker or the API server (the three processes meet
in `vllm_voxserve.contract`). The config hook names `make_scheduler` as vLLM's `scheduler_cls`; it returns a
subclass of `AsyncScheduler` or `Scheduler`, as vLLM itself would choose. Each step:

1. Requests that arrived are checked by the overload guard (`overload_mode="reject"`); a rejected one, and a waiting
   one the planner sheds, is finished by the scheduler with an abort status and a `stop_reason` that the endpoint
   turns into HTTP 503 with `Retry-After` (`contract.encode_rejection`). One rejected at arrival is answered then,
   not after a step (`compat.answer_refusals_at_arrival`).
2. Waiting requests the planner does not admit (deadline-aware deferral, at most `max_prefill_deferral_s` in a row)
   are moved out of `self.waiting` while vLLM schedules, and put back after it (a holdback queue).
3. When more requests run than `max_decode_batch`, only the planner's decode set (least slack first) stays in
   `self.running` while vLLM schedules.
4. After each step, request progress comes from the worker's `StepReport` (carried on the `ModelRunnerOutput`,
   `compat.step_report_of`) when there is one, else it is derived from vLLM's own token counts.
5. Text streams (streaming text in) whose next step's text has not arrived are out of `running` and `waiting` while
   vLLM schedules, in every serving mode (`text_adapter.TextStreamsMixin`).

All times are `time.monotonic()` (system-wide on Linux: the worker's report uses the same clock). A request's own
`ttfa_slo_ms` shifts its arrival time by (its SLO - the server's), so the pure policy sees one T for all requests.
Requests without a voxserve job (vLLM's warm-up) pass through untouched.
"""

from __future__ import annotations

import dataclasses
import math
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus

from vllm_voxserve.compat import answer_refusals_at_arrival, route_mode_rpc_through_scheduler, step_report_of
from vllm_voxserve.config import process_config
from vllm_voxserve.contract import (
    JOB_KEY,
    MODE_RPC_METHOD,
    LaneBacklog,
    RequestProgress,
    StepReport,
    encode_failure,
    encode_rejection,
    expected_frames_of,
)
from vllm_voxserve.fault_injection import RefusalPlan
from vllm_voxserve.scheduler.admission import first_fit, within_stream_limit
from vllm_voxserve.scheduler.overload import SHED_WAITING, OverloadGuard, Rejection
from vllm_voxserve.scheduler.planner import Planner
from vllm_voxserve.scheduler.serving_mode import handle_mode_call
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest, schedule_of
from vllm_voxserve.scheduler.text_adapter import TextStreamsMixin
from vllm_voxserve.step_host_times import StepHostTimes


class SpeechPolicyMixin(TextStreamsMixin):
    """The policy around a vLLM scheduler; mixed in before `Scheduler` or `AsyncScheduler`."""

    clock = staticmethod(time.monotonic)  # the planner's clock (tests set a fake one)
    wall_clock = staticmethod(time.time)  # vLLM's `Request.arrival_time` clock

    stock = False  # True: vLLM's own policy runs untouched (the `vllm-stock` serving mode, serving_mode.py)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        route_mode_rpc_through_scheduler(MODE_RPC_METHOD, handle_mode_call)  # this is the engine-core process
        answer_refusals_at_arrival()
        self._init_text_streams()
        config = process_config(self.vllm_config.additional_config)
        self.planner = Planner(config.scheduler_policy())
        self.max_audio_streams = config.max_codec_slots
        self.audio_streams: set[str] = set()  # the worker's open audio streams at its last report
        self.speech_policy = self.planner.cfg
        self.configured_admission_mode = self.speech_policy.admission_mode  # what a plain codec mode name runs
        self.chunk_schedule = schedule_of(self.speech_policy)  # once, not per stream and step
        self.streams: dict[str, StreamState] = {}  # admitted speech requests
        # Requests vLLM has finished whose audio the worker still decodes (its last report named them): admission
        # counts their codec work. Most of a request's codec work comes after its generation ends (the backbone
        # makes frames several times faster than they play).
        self.draining: dict[str, StreamState] = {}
        self.held: dict[str, WaitingRequest] = {}  # speech requests not yet admitted, in arrival order
        self.to_reject: dict[str, Rejection] = {}  # to finish (`_finish_rejected`)
        self.rejected: list[tuple[Request, Rejection]] = []  # finished, output not yet sent
        self.last_plan = None
        # this engine's data-parallel rank (vLLM sets the index in each rank's engine-core process)
        parallel = self.vllm_config.parallel_config
        self.rank = getattr(parallel, "data_parallel_index", parallel.data_parallel_rank)
        self.refusal_plan = RefusalPlan.from_env()  # tests only (`fault_injection`)
        # The policy's own host time per step, in the engine core's one thread beside vLLM's and the worker's
        # (with one GPU the worker runs in this process): logged like the worker's step host time.
        self.host_times = StepHostTimes(title="voxserve scheduler host time")

    @property
    def admission_mode(self) -> str:
        return self.speech_policy.admission_mode

    def set_policy(self, stock: bool, admission_mode: str | None = None) -> None:
        """Switch between our policy and vLLM's own, and our policy's admission mode (default: the configured one),
        only while vLLM's `has_requests()` is false: nothing running, nothing finished that the workers have not
        been told about. The planner's learned costs carry over."""
        if self.has_requests():
            raise RuntimeError("the scheduling policy changes only while no request is running")
        admission_mode = admission_mode or self.configured_admission_mode
        if admission_mode != self.speech_policy.admission_mode:
            self.planner = Planner(self.speech_policy.replace(admission_mode=admission_mode), self.planner.costs)
            self.speech_policy = self.planner.cfg
        self.stock = stock
        self.streams.clear()
        self.draining.clear()
        self.audio_streams.clear()
        self.held.clear()

    # --- requests in ---

    def add_request(self, request: Request) -> None:
        known = request.request_id in self.requests
        super().add_request(request)
        if not known:  # in every serving mode
            self._add_text_stream(request)
        if known or self.stock:
            return
        now, age = self.clock(), self._age(request)  # one reading for its waiting entry and the gauge
        waiting = self._waiting_request(request, now, age)
        if waiting is None:
            return
        # the part of T spent before the engine saw it (the API server, the hand-over, the step it arrived during)
        self.host_times.add_gauge("arrival age ms", round(age * 1e3, 1))
        rejection = self._check_arrival(now, waiting, request) if self.held or self._busy() else None
        if self.refusal_plan is not None and self.refusal_plan.refuses(self.rank, self._seed(request)):
            rejection = Rejection(request.request_id, self.speech_policy.min_retry_after_s,
                                  f"rank {self.rank} refused it (test refusal)")
        if rejection is not None:
            self.to_reject[request.request_id] = rejection
            self._finish_rejected()  # now: `take_refusals` hands its answer to the engine core before any step
        else:
            self.held[request.request_id] = waiting

    def _check_arrival(self, now: float, waiting: WaitingRequest, request: Request) -> Rejection | None:
        streams, held = [*self.streams.values(), *self.draining.values()], list(self.held.values())
        slo_s = self._slo_s(request)
        if slo_s == self.speech_policy.ttfa_target_s:
            return self.planner.on_arrival(now, waiting, streams, held)
        # Its own SLO: judge it with T = its SLO, every arrival moved into that frame (deadlines unchanged).
        shift = self.speech_policy.ttfa_target_s - slo_s
        guard = OverloadGuard(self.speech_policy.replace(ttfa_target_s=slo_s), self.planner.costs,
                              self.planner.overload.capacity, self.planner.overload.limit)

        def moved(item):
            return dataclasses.replace(item, arrival_time=item.arrival_time + shift)

        rejection = guard.check_arrival(now, moved(waiting), [moved(s) for s in streams], [moved(w) for w in held])
        self.planner.overload.decisions.update(guard.decisions)
        return rejection

    def _seed(self, request: Request) -> int | None:
        return (((request.sampling_params.extra_args if request.sampling_params else None) or {}).get(JOB_KEY)
                or {}).get("seed")

    def _slo_s(self, request: Request) -> float:
        job = ((request.sampling_params.extra_args if request.sampling_params else None) or {}).get(JOB_KEY) or {}
        slo_ms = job.get("ttfa_slo_ms")
        return slo_ms / 1000.0 if slo_ms else self.speech_policy.ttfa_target_s

    def _busy(self) -> bool:
        """An idle server (no stream generating) rejects nothing: there is no load to shed, even where the hardware
        cannot meet T at all (a CPU)."""
        return any(not s.generation_done and not s.paused for s in self.streams.values())

    def _age(self, request: Request) -> float:
        return max(self.wall_clock() - request.arrival_time, 0.0)

    def _waiting_request(self, request: Request, now: float, age: float) -> WaitingRequest | None:
        extra = (request.sampling_params.extra_args if request.sampling_params else None) or {}
        job = extra.get(JOB_KEY)
        if not isinstance(job, dict):
            return None
        shift = self._slo_s(request) - self.speech_policy.ttfa_target_s
        frames = request.max_tokens - 1 if job.get("fixed_length") else expected_frames_of(extra)
        if frames is not None:
            frames = max(1, min(int(frames), request.max_tokens - 1))
        arrival = now - age + shift
        return WaitingRequest(request.request_id, arrival, request.num_prompt_tokens, frames)

    # --- one step ---

    def schedule(self, *args, **kwargs):
        started = time.perf_counter()
        paused = self._hold_paused()
        try:
            output = self._schedule(*args, **kwargs)
        finally:
            self._release_paused(paused)
            self.host_times.add("schedule", time.perf_counter() - started)
        self._idle_while_paused(paused, output)
        self._gauge_prompts_scheduled(output)
        return output

    def _gauge_prompts_scheduled(self, output) -> None:
        """From each request's arrival at the API server to the step that schedules its prompt: beside `arrival age`
        (the way to the engine core), the wait for a prefill, in every serving mode."""
        now = self.wall_clock()
        for new in output.scheduled_new_reqs:
            request = self.requests.get(new.req_id)
            if request is not None:
                self.host_times.add_gauge("arrival to prefill ms", round(max(now - request.arrival_time, 0.0) * 1e3, 1))

    def _schedule(self, *args, **kwargs):
        if self.stock:
            return super().schedule(*args, **kwargs)
        now = self.clock()
        self._forget_finished()
        # the codec lanes are planned in the worker (chunk_dispatch): here both count as busy, so only the LM is
        plan = self.planner.plan_step(now, list(self.streams.values()), list(self.held.values()),
                                      LaneBacklog(urgent_busy=True, background_busy=True))
        self.last_plan = plan
        if self._busy():
            for rejection in plan.reject:
                self.to_reject[rejection.request_id] = rejection
            self.planner.overload.decisions[SHED_WAITING] += len(plan.reject)
        elif plan.reject:  # idle: the planner shed requests it would otherwise admit at once
            plan.admit = [w.request_id for w in first_fit(list(self.held.values()), math.inf, self.planner.costs,
                                                          self.speech_policy)]
        self._finish_rejected()
        if not self.running:
            # Nothing generates: the worker ends every finished request's audio before its next forward (its lanes
            # drain when the last generating request finishes), and no later step brings a report, so the last
            # report's streams are stale. Counting them held every arrival while nothing ran, for good (an H200
            # server hung so with all 256 codec slots counted). Only requests vLLM still holds can keep a slot.
            self.audio_streams = {r for r in self.audio_streams
                                  if r in self.requests and not self.requests[r].is_finished()}
            self.draining.clear()  # likewise: their audio is out before the next step
        open_streams = len(self.audio_streams.union(self.streams))
        plan.admit = within_stream_limit(plan.admit, open_streams, self.max_audio_streams)
        for request_id in plan.admit:
            waiting = self.held.pop(request_id, None)
            if waiting is not None:
                self.streams[request_id] = StreamState.admitted(waiting)
        held_waiting = [r for r in self.waiting if r.request_id in self.held]
        held_running = self._hold_running(plan.decode)
        if held_waiting:
            self.waiting.remove_requests(held_waiting)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.running = [*self.running, *held_running]
            for request in held_waiting:
                self.waiting.add_request(request)

    def _hold_running(self, decode: list[str]) -> list[Request]:
        """Leave only the planner's decode set (in its order, least slack first) and untracked requests running."""
        if len(self.running) <= self.speech_policy.max_decode_batch:
            return []
        rank = {request_id: i for i, request_id in enumerate(decode)}
        tracked = {s.request_id for s in self.streams.values() if not s.generation_done}
        keep, held = [], []
        for request in self.running:
            rid = request.request_id
            (held if rid in tracked and rid not in rank else keep).append(request)
        keep.sort(key=lambda r: rank.get(r.request_id, len(rank)))  # stable: untracked keep vLLM's order
        self.running = keep
        return held

    def _finish_rejected(self) -> None:
        if not self.to_reject:
            return
        rejections, self.to_reject = self.to_reject, {}
        for request_id in rejections:
            self.held.pop(request_id, None)
        for request in self.finish_requests(list(rejections), RequestStatus.FINISHED_ABORTED):
            self.rejected.append((request, rejections[request.request_id]))

    # --- results in ---

    def update_from_output(self, scheduler_output, model_runner_output):
        """vLLM's update (both modes timed: `vllm-stock` gives the stock policy's host time), then ours."""
        started = time.perf_counter()
        try:
            return self._update_from_output(scheduler_output, model_runner_output)
        finally:
            self.host_times.add("update", time.perf_counter() - started)
            self.host_times.add_gauge("admitted streams", len(self.streams))
            self._log_admission()
            self.host_times.end_step()

    def _log_admission(self) -> None:
        """What admission decided and on what estimates, into the periodic line: a run that drifts says why."""
        if self.stock:
            return
        guard = self.planner.overload
        for reason, n in guard.take_decisions().items():
            self.host_times.add_tally(f"admission {reason}", n)
        estimate = guard.capacity.estimate()
        self.host_times.add_gauge("capacity backbone frames/s", round(estimate.backbone_frames_per_s))
        self.host_times.add_gauge("capacity codec frames/s", round(estimate.codec_frames_per_s))
        self.host_times.add_gauge("step overhead ms", round(estimate.overhead_s * 1e3, 2))
        shares = guard.demand_shares()
        if shares is not None:
            self.host_times.add_gauge("demand % of backbone", round(100 * shares[0]))
            self.host_times.add_gauge("demand % of codec", round(100 * shares[1]))

    def _update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        report: StepReport | None = step_report_of(model_runner_output)
        if report is not None and report.failed:  # in every serving mode: a failure is not a policy
            self._finish_failed(report.failed, outputs)
        if self.stock:
            return outputs
        if report is not None:
            self.planner.observe(report)
            self.audio_streams = {p.request_id for p in report.progress}
            self._update_draining(report)
        reported = {p.request_id: p for p in report.progress} if report is not None else {}
        now = self.clock()
        for request_id, stream in self.streams.items():
            progress = reported.get(request_id) or self._derived_progress(stream, now)
            if progress is not None:
                stream.apply(progress)
        self._emit_rejections(outputs)
        self._forget_finished()
        return outputs

    def _derived_progress(self, stream: StreamState, now: float) -> RequestProgress | None:
        """Without a worker report (Model Runner V2): frames from vLLM's token count, chunks as decoded inline."""
        request = self.requests.get(stream.request_id)
        if request is None:
            return None
        frames = max(request.num_output_tokens - 1, 0)  # the last sampled token becomes a frame next step
        chunks = self.chunk_schedule.chunk_of_frame(frames) if frames else 0
        first_audio = stream.first_audio_time if stream.first_audio_time is not None else (now if chunks else None)
        return RequestProgress(stream.request_id, frames, request.is_finished(), chunks,
                               frames * self.speech_policy.frame_duration_s, first_audio)

    def take_refusals(self) -> dict[int, EngineCoreOutputs]:
        """The refused requests not yet answered, as engine outputs by client (`compat.answer_refusals_at_arrival`
        sends them at arrival; what is left goes out with the next step's outputs)."""
        outputs: dict[int, EngineCoreOutputs] = {}
        self._emit_rejections(outputs)
        return outputs

    def _emit_rejections(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        for request, rejection in self.rejected:
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ABORT,
                                   stop_reason=encode_rejection(rejection.retry_after_s, rejection.reason,
                                                               rejection.by_limit))
            outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[])).outputs.append(out)
        self.rejected.clear()

    def _finish_failed(self, failed: dict[str, str], outputs: dict[int, EngineCoreOutputs]) -> None:
        """Requests the worker failed end now with an error, as vLLM ends its own failed requests, instead of
        decoding rows nobody hears until their max tokens (their listener may also never hear of the failure)."""
        live = [r for r in failed if r in self.requests and not self.requests[r].is_finished()]
        if not live:
            return
        for request in self.finish_requests(live, RequestStatus.FINISHED_ERROR):
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                   finish_reason=request.get_finished_reason(),
                                   stop_reason=encode_failure(failed[request.request_id]))
            outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[])).outputs.append(out)

    def _forget_finished(self) -> None:
        for table in (self.streams, self.held):
            for request_id in [r for r in table if r not in self.requests or self.requests[r].is_finished()]:
                stream = table.pop(request_id)
                if table is self.streams and request_id in self.audio_streams:
                    stream.generation_done = True
                    self.draining[request_id] = stream

    def _update_draining(self, report: StepReport) -> None:
        """Finished requests' audio progress from the worker's report; gone from it, their audio is out."""
        reported = {p.request_id: p for p in report.progress}
        for request_id in [r for r in self.draining if r not in reported]:
            del self.draining[request_id]
        for request_id, stream in self.draining.items():
            stream.apply(reported[request_id])
            stream.generation_done = True


class SpeechScheduler(SpeechPolicyMixin, Scheduler):
    pass


class SpeechAsyncScheduler(SpeechPolicyMixin, AsyncScheduler):
    pass


def make_scheduler(**kwargs) -> Scheduler:
    """vLLM's `scheduler_cls` (called with the scheduler's keyword arguments): the subclass vLLM's choice implies."""
    async_scheduling = kwargs["vllm_config"].scheduler_config.async_scheduling
    return (SpeechAsyncScheduler if async_scheduling else SpeechScheduler)(**kwargs)
