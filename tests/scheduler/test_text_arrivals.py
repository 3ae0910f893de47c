"""Text streams in the pure policy: a request runs only while its next step's text token has arrived, and a paused
stream has no deadline (infinite slack, out of the decode set) until it can run, when its deadlines move by the
time its listener waited without audio. Simulated clock."""

from __future__ import annotations

import math

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.slack import generating, slacks
from vllm_voxserve.scheduler.costs import CostModel
from vllm_voxserve.scheduler.streams import StreamState, schedule_of
from vllm_voxserve.scheduler.text_arrivals import TextArrivals


def test_a_step_runs_only_once_its_token_has_arrived():
    texts = TextArrivals()
    texts.add_request("r", "key", 3)  # tokens 0..2: the prefill (token 0) and steps 0, 1
    assert not texts.paused("r", -1) and not texts.paused("r", 1)
    assert texts.paused("r", 2)
    texts.arrived("key", 4)
    assert not texts.paused("r", 2) and texts.paused("r", 3)
    texts.arrived("key", 4, ended=True)  # then tts_eos and tts_pad: every step can run
    assert not texts.paused("r", 100)
    assert not texts.paused("other", 5)  # not a text stream


def test_text_before_the_request_counts_and_forgetting_the_request_drops_its_text():
    texts = TextArrivals()
    texts.arrived("key", 6)  # the text call came before the request
    texts.add_request("r", "key", 2)
    assert not texts.paused("r", 4) and texts.paused("r", 5)
    texts.forget_request("r")
    assert "key" not in texts and texts.request_ids() == []


def test_a_paused_stream_has_no_deadline_and_resumes_with_its_playback_moved():
    cfg = SchedulerPolicyConfig()
    schedule = schedule_of(cfg)
    stream = StreamState("r", arrival_time=0.0, frames_generated=cfg.first_chunk_frames + 2, chunks_delivered=1,
                         first_audio_time=0.1)
    other = StreamState("o", arrival_time=0.0)
    stream.pause(now=0.2)
    assert stream.paused and [s.request_id for s in generating([stream, other])] == ["o"]
    assert slacks([stream], 0.3, CostModel(), cfg) == {"r": math.inf}
    # its first chunk played until 0.1 + its length; the pause ends 2 s later: the listener waited from then on
    ran_out = 0.1 + schedule.audio_before(1)
    stream.resume(now=ran_out + 2.0, schedule=schedule)
    assert not stream.paused and math.isclose(stream.first_audio_time, 0.1 + 2.0)
    assert math.isfinite(slacks([stream], ran_out + 2.0, CostModel(), cfg)["r"])


def test_a_pause_shorter_than_the_audio_ahead_moves_nothing_and_one_before_first_audio_moves_the_ttfa():
    schedule = schedule_of(SchedulerPolicyConfig())
    stream = StreamState("r", arrival_time=0.0, chunks_delivered=2, first_audio_time=0.1)
    stream.pause(now=0.2)
    stream.resume(now=0.3, schedule=schedule)  # its audio plays well past 0.3
    assert stream.first_audio_time == 0.1
    waiting = StreamState("w", arrival_time=1.0)
    waiting.pause(now=1.05)
    waiting.resume(now=1.55, schedule=schedule)
    assert math.isclose(waiting.arrival_time, 1.5)
