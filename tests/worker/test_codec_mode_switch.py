"""A codec mode switch that cannot get its memory is refused and changes nothing: the old mode keeps serving, what
was built for the new one is released, and the worker's reply is 503 (not 500). CPU, with fakes that raise."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tests.worker.test_audio_pipeline import FIRST, check_stream, full_decode, make_pipeline, random_codes
from tests.worker.test_audio_pipeline import program  # noqa: F401 - the module fixture, shared
from vllm_voxserve.worker import codec_runners
from vllm_voxserve.worker.audio_pipeline import CodecModeUnavailable, is_out_of_memory
from vllm_voxserve.worker.rpc import codec_mode_call

def runner_of(pipeline):
    class Runner:  # what the rpc sees of a V1 model runner
        class speech:
            pass

    Runner.speech.pipeline = pipeline
    return Runner


def serves_one_request(pipeline, sender, program, key: str, seed: int) -> None:
    codes = random_codes(FIRST + 1, seed=seed)
    pipeline.open(key, key, "addr")
    pipeline.push(codes, [key] * len(codes))
    pipeline.close(key)
    check_stream(sender, key, full_decode(program, codes), 2)


class PoolWithoutMemory:
    """The program, except that its state pool (the inline codec's memory) cannot be allocated while `full`."""

    def __init__(self, program):
        self.program, self.full, self.attempts = program, False, 0

    def __getattr__(self, name):
        return getattr(self.program, name)

    def make_state_pool(self, slots, device):
        self.attempts += 1
        if self.full:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.program.make_state_pool(slots, device)


def test_a_switch_to_inline_without_memory_is_refused_and_lanes_keep_serving(program):
    tight = PoolWithoutMemory(program)
    pipeline, sender, _ = make_pipeline(tight, "lanes")
    lanes = pipeline.lanes
    tight.full, tight.attempts = True, 0  # the lanes hold their memory; none is left for the inline codec's
    with pytest.raises(CodecModeUnavailable, match="not enough device memory.*still serving in 'lanes'") as refused:
        pipeline.set_codec_mode("inline")
    assert refused.value.out_of_memory and tight.attempts == 1
    assert pipeline.codec_mode == "lanes" and pipeline.lanes is lanes
    assert pipeline.inline is None
    serves_one_request(pipeline, sender, program, "after-refusal", seed=3)
    tight.full = False  # memory freed elsewhere: the same switch now succeeds
    pipeline.set_codec_mode("inline")
    assert pipeline.codec_mode == "inline"
    serves_one_request(pipeline, sender, program, "inline-now", seed=4)


def test_the_worker_answers_503_for_memory_and_500_for_other_build_failures(program, monkeypatch):
    pipeline, sender, _ = make_pipeline(program, "inline")
    built: list[weakref.ref] = []

    class Buffers:  # something a lane build allocates before it fails
        pass

    def lanes_that_fail(message):
        def build(*args, **kwargs):
            buffers = Buffers()
            built.append(weakref.ref(buffers))
            raise RuntimeError(message)

        return build

    monkeypatch.setattr(codec_runners, "LaneDispatch", lanes_that_fail("CUDA error: out of memory"))
    reply = codec_mode_call(runner_of(pipeline), "lanes")
    assert reply["status"] == 503 and reply["current"] == "inline"
    assert "not enough device memory" in reply["error"] and "still serving in 'inline'" in reply["error"]
    assert pipeline.lanes is None and pipeline.codec_mode == "inline"
    gc.collect()
    assert built and built[0]() is None  # what the failed build made is not held anywhere
    monkeypatch.setattr(codec_runners, "LaneDispatch", lanes_that_fail("bad split"))
    reply = codec_mode_call(runner_of(pipeline), "lanes")
    assert reply["status"] == 500 and "could not be built" in reply["error"] and reply["current"] == "inline"
    serves_one_request(pipeline, sender, program, "still-inline", seed=5)


def test_out_of_memory_is_recognised_by_type_or_message():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("device-side assert triggered"))
    assert not is_out_of_memory(ValueError("out of memory"))
