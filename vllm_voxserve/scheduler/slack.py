"""Slack of a running request: how long its LM work can wait before its next chunk misses its deadline."""

from __future__ import annotations

from typing import Iterable, Sequence

from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import INFINITE_SLACK, StreamState, WaitingRequest


class SlackEstimator:
    """Deadline of the chunk being generated, minus now, minus the time to generate its remaining frames and decode
    it (paper §3.2), with the step and codec costs of one planning round. Finished requests have infinite slack.

    A frame takes a step: the decode's cost at the batch plus `overhead_s`, what steps measurably take beyond it
    (`capacity.CapacityModel.overhead_s`: host time between steps, packed prefills, urgent codec calls). The decode
    cost alone made every slack too long by the overhead of each frame still to make: on the H200 the device
    waited p50 2-9 ms before each step where the engine's thread was the bottleneck (2026-12-04_4af55f2, start 3),
    so a first chunk of 5 frames had 10-45 ms less slack than a deferred prefill was given. A first chunk's audio
    follows its cut after `first_audio_s` (`capacity.CapacityModel.first_audio_handover_s`), not the urgent decode's
    cost alone: the worker hands it over at a later step."""

    def __init__(self, now: float, decode_batch: int, costs: CostModel, cfg: SchedulerPolicyConfig,
                 overhead_s: float = 0.0, first_audio_s: float | None = None) -> None:
        self.now = now
        self.cfg = cfg
        self.step_s = costs.decode_step_s(decode_batch) + overhead_s
        self.first_codec_s = costs.urgent_codec_s(1) if first_audio_s is None else first_audio_s
        self.later_codec_s = costs.background_codec_s(1)

    def __call__(self, stream: StreamState) -> float:
        # `lm_chunk`, `end_frame` and `chunk_deadline` inlined: this runs for every generating request at every
        # engine step (the planner's largest share of host time on the 2-core CPU machine)
        if stream.generation_done or stream.paused_at is not None:  # paused: no deadline until it can run
            return INFINITE_SLACK
        first, size, made = self.cfg.first_chunk_frames, self.cfg.chunk_frames, stream.frames_generated
        chunk = 0 if made < first else 1 + (made - first) // size
        end = first + chunk * size
        if stream.expected_frames is not None and made < stream.expected_frames < end:
            end = stream.expected_frames
        frames_to_go = max(end - made, 1)
        if chunk == 0:
            deadline, codec_s = stream.arrival_time + self.cfg.ttfa_target_s, self.first_codec_s
        else:
            played = stream.first_audio_time
            start = played if played is not None else stream.arrival_time + self.cfg.ttfa_target_s
            deadline = start + (first + (chunk - 1) * size) * self.cfg.frame_duration_s
            codec_s = self.later_codec_s
        return deadline - self.now - frames_to_go * self.step_s - codec_s


def waiting_slack(
    request: WaitingRequest, now: float, decode_batch: int, costs: CostModel, cfg: SchedulerPolicyConfig,
    overhead_s: float = 0.0, first_audio_s: float | None = None,
) -> float:
    """How long a waiting request can still wait for its prefill: its first chunk's deadline (arrival + T), minus
    now, its prefill, its first chunk's frames at the step of `decode_batch` rows and the chunk's way to audio
    (`overhead_s` and `first_audio_s` as in `SlackEstimator`)."""
    step_s = costs.decode_step_s(decode_batch) + overhead_s
    to_audio_s = costs.urgent_codec_s(1) if first_audio_s is None else first_audio_s
    return (request.arrival_time + cfg.ttfa_target_s - now - costs.prefill_s(request.prompt_tokens)
            - cfg.first_chunk_frames * step_s - to_audio_s)


def generating(streams: Iterable[StreamState]) -> list[StreamState]:
    """Streams the backbone decodes now: not done, nor paused waiting for text."""
    return [s for s in streams if not s.generation_done and s.paused_at is None]


def slacks(
    active: Sequence[StreamState], now: float, costs: CostModel, cfg: SchedulerPolicyConfig, overhead_s: float = 0.0,
    first_audio_s: float | None = None,
) -> dict[str, float]:
    """Slack of each generating request, at the decode batch they make together (`SlackEstimator`)."""
    if not active:
        return {}
    slack = SlackEstimator(now, min(len(active), cfg.max_decode_batch), costs, cfg, overhead_s, first_audio_s)
    return {s.request_id: slack(s) for s in active}


def min_slack(values: Iterable[float]) -> float:
    """Smallest slack among running requests. A request already past saving (negative slack) is left out (the
    paper's rule counts it): deferring a prefill cannot bring its chunk back in time, and counting it would let one
    late request hold back every prefill behind it."""
    return min((v for v in values if v >= 0), default=INFINITE_SLACK)
