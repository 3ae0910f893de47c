"""Prefill admission on the LM lane (paper §3.2 and §4.7).

A prefill runs on the whole GPU and delays the next decode step of every running request.

- prefill_first: admit waiting requests in arrival order as soon as the LM lane can take them.
- deadline_aware: admit only the prefills whose estimated duration fits within the smallest slack of the running
  requests; otherwise defer, but never for more than `max_prefill_deferral_s` in a row: once the lane has deferred
  that long, it admits a full prefill (the paper's literal rule, the oldest waiting request alone, admits one request
  per deferral limit past capacity). A prefill is not deferred when the oldest waiting request has no more slack than
  the running requests (the paper weighs the running ones alone): deferring it would trade a running request's
  deadline for a nearer one, and each deferral would eat the slack of the requests it holds back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import INFINITE_SLACK, WaitingRequest


_CLOCK_EPSILON_S = 1e-9  # so that float sums of steps that make exactly the limit do not count as past it


@dataclass(slots=True)
class AdmissionDecision:
    admit: list[WaitingRequest] = field(default_factory=list)
    deferred: bool = False  # the slack rule held back a prefill this step
    forced: bool = False  # admitted because the deferral limit was reached


def first_fit(
    waiting: Sequence[WaitingRequest], budget_s: float, costs: CostModel, cfg: SchedulerPolicyConfig
) -> list[WaitingRequest]:
    """The longest arrival-order prefix of `waiting` whose one prefill fits the per-step limits and `budget_s`."""
    chosen: list[WaitingRequest] = []
    tokens = 0
    for request in waiting[: cfg.max_prefills_per_step]:
        if chosen and tokens + request.prompt_tokens > cfg.max_prefill_tokens:
            break
        if costs.prefill_s(tokens + request.prompt_tokens) > budget_s:
            break
        chosen.append(request)
        tokens += request.prompt_tokens
    return chosen


def within_stream_limit(admit: list[str], open_streams: int, max_streams: int) -> list[str]:
    """The prefix of `admit` that keeps the open audio streams (admitted requests, and finished ones whose audio is
    still being decoded) within `max_streams`, the codec's state slots: a request past it waits instead of failing."""
    return admit[: max(max_streams - open_streams, 0)]


class PrefillAdmission:
    """Holds the one piece of state of the rule: since when the lane has been deferring prefills."""

    def __init__(self, cfg: SchedulerPolicyConfig, costs: CostModel) -> None:
        self.cfg = cfg
        self.costs = costs
        self.deferring_since: float | None = None

    def decide(
        self, now: float, waiting: Sequence[WaitingRequest], smallest_slack_s: float, next_step_s: float = 0.0,
        waiting_slack_s: float = INFINITE_SLACK,
    ) -> AdmissionDecision:
        """`waiting` in arrival order; `smallest_slack_s` over the running requests (inf when none run);
        `next_step_s`: when the lane will decide next, so that a prefill goes in before it passes the limit;
        `waiting_slack_s`: the oldest waiting request's (`slack.waiting_slack`)."""
        if not waiting:
            self.deferring_since = None
            return AdmissionDecision()
        if not self.cfg.deadline_aware or waiting_slack_s <= smallest_slack_s:
            self.deferring_since = None
            return AdmissionDecision(first_fit(waiting, float("inf"), self.costs, self.cfg))
        admit = first_fit(waiting, smallest_slack_s, self.costs, self.cfg)
        if admit:
            self.deferring_since = None
            return AdmissionDecision(admit)
        if self.deferring_since is None:
            self.deferring_since = now
        if now + next_step_s - self.deferring_since > self.cfg.max_prefill_deferral_s + _CLOCK_EPSILON_S:
            self.deferring_since = None
            return AdmissionDecision(first_fit(waiting, float("inf"), self.costs, self.cfg), forced=True)
        return AdmissionDecision(deferred=True)

    def deferral_deadline(self) -> float | None:
        """When a deferred prefill will be forced in; the caller must plan a step by then."""
        if self.deferring_since is None:
            return None
        return self.deferring_since + self.cfg.max_prefill_deferral_s
