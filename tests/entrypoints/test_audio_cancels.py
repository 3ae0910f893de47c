"""A listener who leaves early: the API server tells the workers (`AudioCancels`), so that no audio is decoded for
nobody. No server: `SpeechService.synthesize` runs with a fake engine client and a fake receiver queue."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

pytest.importorskip("vllm")
from vllm_voxserve.contract import CANCEL_RPC_METHOD as CANCEL_RPC  # noqa: E402
from vllm_voxserve.entrypoints.rank_choice import RankChoice  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import AudioCancels, SpeechService  # noqa: E402
from vllm_voxserve.transport import AUDIO, END  # noqa: E402
from tests.entrypoints.fake_audio_receiver import FakeReceiver


class SlowRpcEngine:
    """collective_rpc calls are recorded and each waits until the test releases it; generate() finishes at once (the
    request is done generating, its audio is not)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []
        self.release = asyncio.Event()

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, args))
        await self.release.wait()
        return [{"status": 200, "cancelled": len(args[0])}]

    async def generate(self, prompt, params, request_id):
        yield types.SimpleNamespace(finished=True, outputs=[types.SimpleNamespace(stop_reason=None, token_ids=[])])


def test_the_rpc_names_are_methods_of_both_workers():
    from vllm_voxserve.contract import MODE_RPC_METHOD
    from vllm_voxserve.worker.cpu_worker import VoxServeCPUWorker
    from vllm_voxserve.worker.gpu_worker import VoxServeGPUWorker

    for worker in (VoxServeCPUWorker, VoxServeGPUWorker):
        assert callable(getattr(worker, CANCEL_RPC, None)) and callable(getattr(worker, MODE_RPC_METHOD, None))


def test_departures_during_a_call_go_together_in_the_next_one():
    async def run():
        engine = SlowRpcEngine()
        cancels = AudioCancels(engine)
        cancels.add("a")
        await asyncio.sleep(0)  # the first call is now in flight
        for key in ("c", "b", "c"):
            cancels.add(key)
        await asyncio.sleep(0)
        assert engine.calls == [(CANCEL_RPC, (["a"],))]
        engine.release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        return engine.calls

    assert asyncio.run(run()) == [(CANCEL_RPC, (["a"],)), (CANCEL_RPC, (["b", "c"],))]


def test_a_failing_call_is_logged_and_later_departures_still_go(caplog):
    class Broken(SlowRpcEngine):
        async def collective_rpc(self, method, args=()):
            self.calls.append((method, args))
            raise RuntimeError("engine gone")

    async def run():
        engine = Broken()
        cancels = AudioCancels(engine)
        cancels.add("a")
        await asyncio.sleep(0.01)
        cancels.add("b")
        await asyncio.sleep(0.01)
        return engine.calls

    assert asyncio.run(run()) == [(CANCEL_RPC, (["a"],)), (CANCEL_RPC, (["b"],))]
    assert "cancelling the audio of 1 stream(s) failed" in caplog.text


def make_service(engine):
    service = SpeechService.__new__(SpeechService)  # no checkpoint needed for synthesize()
    service.engine_client, service.receiver, service.cancels = engine, FakeReceiver(), AudioCancels(engine)
    service.ranks = RankChoice(1)
    return service


def test_only_a_listener_who_leaves_before_the_end_is_cancelled():
    async def run():
        engine = SlowRpcEngine()
        engine.release.set()
        service = make_service(engine)
        chunk = np.zeros(4, np.float32)
        # one listener hears a chunk and leaves: its stream is cancelled
        leaving = service.synthesize(types.SimpleNamespace(stream_key="leaves", ref_audio=b""), [0], None)
        first = asyncio.ensure_future(leaving.__anext__())
        await asyncio.sleep(0)
        service.receiver.queues["leaves"].put_nowait((AUDIO, chunk))
        assert (await first) is chunk
        await leaving.aclose()
        # another hears its whole stream: nothing to cancel
        staying = service.synthesize(types.SimpleNamespace(stream_key="stays", ref_audio=b""), [0], None)
        pending = asyncio.ensure_future(anext_or_none(staying))
        await asyncio.sleep(0)
        service.receiver.queues["stays"].put_nowait((AUDIO, chunk))
        service.receiver.queues["stays"].put_nowait((END, None))
        heard = [await pending]
        async for piece in staying:
            heard.append(piece)
        assert len(heard) == 1
        # one that leaves before any audio arrived is cancelled too
        early = service.synthesize(types.SimpleNamespace(stream_key="early", ref_audio=b""), [0], None)
        waiting = asyncio.ensure_future(early.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(5):
            await asyncio.sleep(0)
        return [keys for _, (keys,) in engine.calls]

    assert asyncio.run(run()) == [["leaves"], ["early"]]


async def anext_or_none(generator):
    async for item in generator:
        return item
    return None
