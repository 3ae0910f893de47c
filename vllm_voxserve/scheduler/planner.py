"""One scheduling decision per engine step: plain data in, plain data out, the clock passed in.

Protocol for the caller (the vLLM scheduler adapter, or the simulation), all times on one monotonic clock:
1. New request: `on_arrival(now, WaitingRequest, streams, waiting)`; a `Rejection` means answer HTTP 503 with
   `Retry-After: ceil(retry_after_s)` and the reason; otherwise append it to `waiting` (arrival order).
2. After each LM step / codec batch: `StreamState.apply(RequestProgress)` per request, `observe(StepReport)`.
3. Whenever a lane can take work: `plan_step(now, streams, waiting, lanes, lm_free)`. With `lm_free=True` (once
   per LM step, when the LM lane is about to run its next step) it also says which waiting requests to prefill
   (`admit`: move them to `streams` with `StreamState.admitted`), which to reject (503), and which running requests
   the decode step takes. `urgent` / `background` are batches to launch now on an idle codec lane; mark their
   requests `chunk_in_flight` until the audio is out. Call again by `wake_at` even if nothing else happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from vllm_voxserve.scheduler.admission import PrefillAdmission
from vllm_voxserve.scheduler.background_batching import background_batch
from vllm_voxserve.scheduler.costs import CostModel, seed_named
from vllm_voxserve.scheduler.decode_order import decode_order
from vllm_voxserve.scheduler.overload import OverloadGuard, Rejection
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.contract import LaneBacklog, StepReport
from vllm_voxserve.scheduler.slack import generating, min_slack, slacks, waiting_slack
from vllm_voxserve.scheduler.streams import INFINITE_SLACK, StreamState, WaitingRequest
from vllm_voxserve.scheduler.urgency import ReadyChunk, ready_chunks, split_by_urgency, urgent_batch


@dataclass(slots=True)
class StepPlan:
    admit: list[str] = field(default_factory=list)  # waiting requests to prefill now, in this order
    reject: list[Rejection] = field(default_factory=list)  # waiting requests to end with 503 + Retry-After
    decode: list[str] = field(default_factory=list)  # running requests for the next decode step
    urgent: list[ReadyChunk] = field(default_factory=list)  # launch now on the urgent lane
    background: list[ReadyChunk] = field(default_factory=list)  # launch now on the background lane
    prefill_deferred: bool = False
    wake_at: float | None = None  # plan again by then even if nothing else happens


class Planner:
    def __init__(self, cfg: SchedulerPolicyConfig | None = None, costs: CostModel | None = None) -> None:
        self.cfg = cfg or SchedulerPolicyConfig()
        self.costs = costs or CostModel(seed_named(self.cfg.cost_seed, self.cfg.codec_sms))
        self.admission = PrefillAdmission(self.cfg, self.costs)
        self.overload = OverloadGuard(self.cfg, self.costs)
        self._last_lm_step_at: float | None = None  # when the last plan that started an LM step was made
        self._last_lm_rows = 0  # the requests that step decoded

    def observe(self, report: StepReport) -> None:
        for sample in report.costs:
            self.costs.observe(sample)
        for handover_s in report.first_audio_handovers:
            self.overload.capacity.observe_first_audio(handover_s)

    def on_arrival(
        self, now: float, request: WaitingRequest, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest]
    ) -> Rejection | None:
        """None to queue the request; a Rejection to answer 503 (with Retry-After) at once."""
        return self.overload.check_arrival(now, request, streams, waiting)

    def plan_step(
        self,
        now: float,
        streams: Sequence[StreamState],
        waiting: Sequence[WaitingRequest],
        lanes: LaneBacklog,
        lm_free: bool = True,
        lm_has_work: bool | None = None,
    ) -> StepPlan:
        """`waiting` in arrival order. LM fields are filled only when `lm_free`; a codec lane's only when idle.
        `lm_has_work`: whether the LM still has requests to generate or admit, when the caller passes only the
        streams with a chunk to place (default: judged from `streams` and `waiting`)."""
        plan = StepPlan()
        if lm_free:
            if self._last_lm_step_at is not None:
                self.overload.capacity.observe_step(now - self._last_lm_step_at, self._last_lm_rows)
            self._plan_lm(now, streams, waiting, plan)
            self._last_lm_step_at = now if plan.admit or plan.decode else None
            self._last_lm_rows = len(plan.decode)
        if lm_has_work is None:
            lm_has_work = bool(waiting) or any(not s.generation_done for s in streams)
        self._plan_codec(now, streams, lanes, lm_has_work, plan)
        return plan

    def _plan_lm(
        self, now: float, streams: Sequence[StreamState], waiting: Sequence[WaitingRequest], plan: StepPlan
    ) -> None:
        active = generating(streams)
        plan.reject = self.overload.shed_waiting(now, waiting, len(active))
        rejected = {r.request_id for r in plan.reject}
        candidates = [w for w in waiting if w.request_id not in rejected] if rejected else waiting
        # measured: the steps' time beyond their decode cost, and a first chunk's from its cut to its audio
        overhead_s, to_audio_s = self.overload.capacity.overhead_s, self.overload.capacity.first_audio_handover_s()
        slack = slacks(active, now, self.costs, self.cfg, overhead_s, to_audio_s)
        next_step_s = self.overload.step_s(len(active))
        head_slack = INFINITE_SLACK
        if candidates and self.cfg.deadline_aware:
            batch = min(len(active) + 1, self.cfg.max_decode_batch)
            head_slack = waiting_slack(candidates[0], now, batch, self.costs, self.cfg, overhead_s, to_audio_s)
            if head_slack < 0:
                head_slack = INFINITE_SLACK  # past saving, like a late running request (`min_slack`)
        decision = self.admission.decide(now, candidates, min_slack(slack.values()), next_step_s,
                                         head_slack)
        plan.admit = [w.request_id for w in decision.admit]
        plan.prefill_deferred = decision.deferred
        plan.wake_at = self.admission.deferral_deadline()
        plan.decode = decode_order(active, slack, self.cfg)

    def _plan_codec(
        self,
        now: float,
        streams: Sequence[StreamState],
        lanes: LaneBacklog,
        lm_has_work: bool,
        plan: StepPlan,
    ) -> None:
        if lanes.urgent_busy and lanes.background_busy:
            return  # neither lane can take a batch: nothing to place (the LM-only caller passes this)
        urgent, background = split_by_urgency(ready_chunks(streams, self.cfg), now, self.cfg.urgent_margin_s)
        if not lanes.urgent_busy:
            plan.urgent = urgent_batch(urgent, self.cfg.urgent_max_batch)
        if not lanes.background_busy:
            plan.background = background_batch(background, now, lm_has_work, self.costs, self.cfg)
        launched = {c.request_id for c in plan.background}
        # A chunk left waiting turns urgent δu before its deadline: plan again by then.
        for chunk in background:
            if chunk.request_id not in launched:
                plan.wake_at = _earliest(plan.wake_at, chunk.deadline - self.cfg.urgent_margin_s)


def _earliest(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
