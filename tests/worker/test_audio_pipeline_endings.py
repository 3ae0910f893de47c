"""How a request's audio stream ends in the AudioPipeline (CPU, tiny Qwen3 codec): closed with chunks in flight,
failed, finished beside requests still generating, or cancelled by its listener."""

from __future__ import annotations

import pytest
import torch

from tests.worker.test_audio_pipeline import (
    FIRST,
    LATER,
    check_stream,
    full_decode,
    hold_lane_batches,
    make_pipeline,
    random_codes,
)
from tests.worker.test_audio_pipeline import program  # noqa: F401 - the module fixture, shared
from vllm_voxserve.codec_lanes import LaneKind
from vllm_voxserve.worker.rpc import cancel_audio_call


def test_close_with_a_chunk_in_flight_and_a_partial_chunk_loses_nothing(program):
    pipeline, sender, launches = make_pipeline(program, "lanes")
    gate = hold_lane_batches(pipeline)
    a, b = random_codes(FIRST + 2, seed=5), random_codes(FIRST + LATER + 1, seed=6)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(torch.cat([a[:FIRST], b[:FIRST]]), ["a"] * FIRST + ["b"] * FIRST)
    assert launches[-1][:2] == (LaneKind.URGENT, [("a", 0), ("b", 0)])
    pipeline.push(a[FIRST:], ["a"] * 2)  # a partial chunk pending
    pipeline.close("a")  # chunk 0 still in flight, b still generating: nothing can be sent yet
    assert sender.of("key-a") == []
    pipeline.push(b[FIRST:FIRST + LATER], ["b"] * LATER)
    assert sender.messages == []
    gate["open"] = True
    pipeline.push(b[FIRST + LATER:], ["b"])  # harvests both chunk 0s; a's last chunk waits for a batch
    assert [m[0] for m in sender.of("key-a")] == ["audio"]
    gate["open"] = False
    pipeline.close("b")  # nothing generates any more: the lanes drain (blocking) before close returns
    check_stream(sender, "key-a", full_decode(program, a), 2)
    check_stream(sender, "key-b", full_decode(program, b), 3)
    assert not pipeline.lanes.busy and pipeline.lanes.manager.slots.num_free == 8


def test_closing_the_last_request_with_its_last_full_chunk_in_flight_sends_end_after_it(program):
    pipeline, sender, _ = make_pipeline(program, "lanes")
    hold_lane_batches(pipeline)
    codes = random_codes(FIRST, seed=7)
    pipeline.open("a", "key-a", "addr")
    pipeline.push(codes, ["a"] * FIRST)  # chunk 0 is full and in flight, not known to be the last
    assert sender.messages == []
    pipeline.close("a")
    check_stream(sender, "key-a", full_decode(program, codes), 1)


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_a_failed_request_gets_error_and_frees_its_slot(program, mode):
    pipeline, sender, _ = make_pipeline(program, mode)
    gate = hold_lane_batches(pipeline) if mode == "lanes" else None
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(random_codes(FIRST + 1, seed=8), ["a"] * (FIRST + 1))
    pipeline.fail("a", "boom")
    failed = sender.of("key-a")
    assert failed[-1][0] == "error" and failed[-1][3] == "boom"
    pipeline.close("a")  # vLLM still finishes it: nothing more is sent
    pipeline.close("b")  # the last request: the lanes drain, the failed request's chunk in flight included
    assert sender.of("key-a") == failed
    assert [m[0] for m in sender.of("key-b")] == ["end"]
    if gate is not None:
        assert pipeline.lanes.manager.slots.num_free == 8 and not pipeline.lanes.busy
        assert pipeline.lanes.queued_chunks == 0
    else:
        assert len(pipeline.inline.free_slots) == 8


def test_a_request_finishing_beside_generating_ones_leaves_its_last_chunk_to_the_steps_pumps(program):
    """vLLM finishes requests at the start of a step whose own pump follows: finishing one launches nothing by
    itself while others generate (a pump per finished request was host time at every step), and all its audio
    still arrives."""
    pipeline, sender, launches = make_pipeline(program, "lanes")
    gate = hold_lane_batches(pipeline)
    a, b = random_codes(FIRST + 2, seed=27), random_codes(FIRST + 2 * LATER, seed=28)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(torch.cat([a[:FIRST], b[:FIRST]]), ["a"] * FIRST + ["b"] * FIRST)  # chunk 0s in flight
    pipeline.push(a[FIRST:], ["a"] * 2)  # a partial last chunk pending
    gate["open"] = True  # the chunk 0s finished on the device
    launched = len(launches)
    pipeline.close("a")  # b still generates
    assert len(launches) == launched and sender.messages == []  # neither harvested nor launched
    for frame in range(FIRST, FIRST + 2 * LATER):  # the next steps
        pipeline.push(b[frame:frame + 1], ["b"])
    pipeline.close("b")
    check_stream(sender, "key-a", full_decode(program, a), 2)
    check_stream(sender, "key-b", full_decode(program, b), 3)
    assert not pipeline.lanes.busy and pipeline.lanes.manager.slots.num_free == 8


def test_cancelling_a_finished_requests_stream_drops_its_backlog_and_keeps_the_others(program):
    """A listener that leaves after its request finished generating: its queued chunks are never decoded, nothing
    more is sent on its stream, its slots come back; the other stream's audio is whole."""
    pipeline, sender, launches = make_pipeline(program, "lanes")
    gate = hold_lane_batches(pipeline)
    a, b = random_codes(FIRST + 3 * LATER, seed=21), random_codes(FIRST + LATER, seed=22)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(torch.cat([a[:FIRST], b[:FIRST]]), ["a"] * FIRST + ["b"] * FIRST)  # both chunk 0s in flight
    pipeline.push(a[FIRST:], ["a"] * 3 * LATER)  # a's chunks 1-3 wait behind its chunk 0
    pipeline.close("a")  # a generates no more; b does
    assert pipeline.lanes.queued_chunks == 3
    assert pipeline.cancel(["key-a", "key-unknown"]) == 1
    assert pipeline.lanes.queued_chunks == 0 and "a" not in pipeline.streams
    gate["open"] = True
    pipeline.push(b[FIRST:], ["b"] * LATER)  # harvests both chunk 0s: a's audio is dropped
    pipeline.close("b")
    assert sender.of("key-a") == []
    check_stream(sender, "key-b", full_decode(program, b), 2)
    assert all(request_id != "a" for _, chunks, _ in launches[1:] for request_id, _ in chunks)
    assert pipeline.lanes.manager.slots.num_free == 8 and not pipeline.lanes.busy
    assert pipeline.frame_store._slots.num_free == 8


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_cancelling_a_generating_stream_ends_it_silently_and_vllms_finish_after_it_is_a_no_op(program, mode):
    pipeline, sender, _ = make_pipeline(program, mode)
    a, b = random_codes(FIRST + LATER + 1, seed=23), random_codes(FIRST + 2, seed=24)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(torch.cat([a[:FIRST], b[:FIRST]]), ["a"] * FIRST + ["b"] * FIRST)
    pipeline.push(a[FIRST:FIRST + 2], ["a"] * 2)  # a partial chunk pending
    heard = sender.of("key-a")
    assert pipeline.cancel(["key-a"]) == 1
    pipeline.push(torch.cat([a[FIRST + 2:], b[FIRST:]]), ["a"] * (LATER - 1) + ["b"] * 2)  # vLLM's abort lags
    pipeline.close("a")  # then vLLM finishes it
    pipeline.close("b")
    assert sender.of("key-a") == heard  # nothing after the cancel, not even END
    check_stream(sender, "key-b", full_decode(program, b), 2)
    assert not pipeline.streams
    if mode == "lanes":
        assert pipeline.lanes.manager.slots.num_free == 8 and not pipeline.lanes.busy
    else:
        assert len(pipeline.inline.free_slots) == 8


def test_cancelling_the_last_generating_stream_drains_the_finished_ones(program):
    """The engine may take no step after the cancel (nothing generates): the others' audio must not wait for one."""
    pipeline, sender, _ = make_pipeline(program, "lanes")
    gate = hold_lane_batches(pipeline)
    a, b = random_codes(FIRST, seed=25), random_codes(FIRST + LATER, seed=26)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")
    pipeline.push(torch.cat([a, b[:FIRST]]), ["a"] * FIRST + ["b"] * FIRST)  # both chunk 0s in flight
    pipeline.push(b[FIRST:], ["b"] * LATER)
    pipeline.close("b")  # b finished generating, its chunk 1 waits; a still generates
    assert sender.messages == []
    gate["open"] = False
    pipeline.cancel(["key-a"])
    check_stream(sender, "key-b", full_decode(program, b), 2)
    assert sender.of("key-a") == []
    assert not pipeline.lanes.busy and pipeline.lanes.manager.slots.num_free == 8


def test_worker_rpc_cancels_by_stream_key(program):
    pipeline, sender, _ = make_pipeline(program, "lanes")

    class Runner:
        speech = type("Speech", (), {"pipeline": pipeline})()

    pipeline.open("a", "key-a", "addr")
    assert cancel_audio_call(Runner(), ["key-a", "key-b"]) == {"status": 200, "cancelled": 1}
    assert cancel_audio_call(Runner(), ["key-a"]) == {"status": 200, "cancelled": 0}
    assert cancel_audio_call(object(), ["key-a"])["status"] == 503
