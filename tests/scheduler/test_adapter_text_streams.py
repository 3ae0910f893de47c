"""Text streams inside a real vLLM scheduler on CPU (fake clock and runner outputs, `test_adapter`'s step tables): a
request whose next step reads a text token that has not arrived is not scheduled, keeps its KV blocks and has no
deadline; text arriving through the text call lets it run exactly as far as the text goes; TEXT_CLOSED ends it."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from vllm_voxserve.contract import TEXT_CLOSED, TEXT_ENDED, TEXT_OPEN  # noqa: E402
from vllm_voxserve.scheduler.text_adapter import handle_text_call  # noqa: E402
from tests.scheduler.test_adapter import build, speech_request, step, v1_runner_rules  # noqa: E402, F401


def text_request(rid: str, clock, tokens: int, key: str = "k") -> Request:
    job = {"fixed_length": True, "text_stream": True, "stream_key": key, "prompt": {"text_ids": list(range(tokens))}}
    return Request(rid, [0] * 20, SamplingParams(max_tokens=200, extra_args={"voxserve": job}), None,
                   arrival_time=clock.t)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_text_stream_runs_as_far_as_its_text_goes_then_waits_holding_its_blocks(async_scheduling):
    scheduler, clock = build(async_scheduling=async_scheduling)
    scheduler.add_request(text_request("t", clock, tokens=3))  # the prefill reads token 0, steps 0 and 1 the rest
    scheduler.add_request(speech_request("p", clock))
    table = [step(scheduler, clock)[0] for _ in range(5)]
    assert table == [{"t", "p"}, {"t", "p"}, {"t", "p"}, {"p"}, {"p"}]
    t = scheduler.requests["t"]
    assert not t.is_finished() and t.num_output_tokens == 3
    assert any(scheduler.kv_cache_manager.get_block_ids("t")[0])  # its KV cache stays
    assert scheduler.streams["t"].paused and "t" not in scheduler.last_plan.decode  # no deadline meanwhile
    forwarded = []
    replies = handle_text_call(scheduler, ("k", 3, [7, 8], TEXT_OPEN), lambda args: forwarded.append(args) or [{}])
    assert forwarded == [("k", 3, [7, 8], TEXT_OPEN)] and replies == [{}]  # the workers get it too
    table = [step(scheduler, clock)[0] for _ in range(3)]
    assert table == [{"t", "p"}, {"t", "p"}, {"p"}]  # steps 2 and 3 read tokens 3 and 4
    handle_text_call(scheduler, ("k", 5, [], TEXT_ENDED), lambda args: [{}])
    assert step(scheduler, clock)[0] == {"t", "p"} and not scheduler.streams["t"].paused
    handle_text_call(scheduler, ("k", 5, [], TEXT_CLOSED), lambda args: [{}])
    assert t.is_finished() and step(scheduler, clock)[0] == {"p"}


def test_text_that_arrives_before_its_request_counts_and_bad_calls_are_refused():
    scheduler, clock = build()
    handle_text_call(scheduler, ("k", 2, [5, 6, 7], TEXT_OPEN), lambda args: [{}])
    scheduler.add_request(text_request("t", clock, tokens=2))
    table = [step(scheduler, clock)[0] for _ in range(6)]
    assert table == [{"t"}, {"t"}, {"t"}, {"t"}, {"t"}, set()]  # prefill, then steps 0..3 (tokens 1..4)
    assert handle_text_call(scheduler, ("k", 0, [], "half-open"), lambda args: [{}])[0]["status"] == 400


def test_a_closed_stream_ends_its_waiting_request_and_nothing_else():
    scheduler, clock = build()
    t = text_request("t", clock, tokens=1)
    scheduler.add_request(t)
    scheduler.add_request(text_request("u", clock, tokens=1, key="other"))
    assert step(scheduler, clock)[0] == {"t", "u"}
    assert step(scheduler, clock)[0] == set()  # both wait for their step 0's token
    handle_text_call(scheduler, ("k", 1, [], TEXT_CLOSED), lambda args: [{}])
    assert t.is_finished() and "t" not in scheduler.requests and not scheduler.requests["u"].is_finished()


def test_the_engine_core_waits_on_its_input_while_every_request_waits_for_text():
    scheduler, clock = build()
    scheduler.wait_for_text_on_input = True  # as on CPU (the inline codec)
    scheduler.add_request(text_request("t", clock, tokens=1))
    assert scheduler.has_requests()
    step(scheduler, clock)  # the prefill; step 0 then waits for token 1
    assert not scheduler.has_requests()
    handle_text_call(scheduler, ("k", 1, [5], TEXT_OPEN), lambda args: [{}])
    assert scheduler.has_requests()
    step(scheduler, clock)
    assert not scheduler.has_requests()
    scheduler.add_request(speech_request("p", clock))  # another request to run: the engine steps
    assert scheduler.has_requests()
    scheduler.finish_requests(["p"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.has_requests()  # the worker has yet to hear that p finished
    step(scheduler, clock)
    assert not scheduler.has_requests()
    scheduler.audio_streams = {"t", "gone"}  # the last report named a stream that vLLM no longer holds
    assert scheduler.has_requests()  # one step more: it finds nothing runs and forgets that stream
    step(scheduler, clock)
    assert scheduler.audio_streams == {"t"} and not scheduler.has_requests()
    scheduler.wait_for_text_on_input = False  # as on a GPU (the codec lanes): it keeps stepping
    assert scheduler.has_requests()
