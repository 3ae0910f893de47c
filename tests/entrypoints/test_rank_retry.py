"""Data parallelism in the API server without a server: a rank's refusal is retried on another rank, a 503 comes
only when every rank refused, each rank's open streams are counted until their audio ends; admin and stats calls
reach every rank (`compat.collective_rpc_per_rank`)."""

from __future__ import annotations

import asyncio
import time
import types

import numpy as np
import pytest

pytest.importorskip("vllm")
from vllm_voxserve.compat import collective_rpc_per_rank, data_parallel_ranks, steers_every_engine  # noqa: E402
from vllm_voxserve.contract import encode_rejection  # noqa: E402
from vllm_voxserve.entrypoints.engine_metrics import merge_rank_snapshots  # noqa: E402
from vllm_voxserve.entrypoints.rank_choice import LIMIT_MARK_S, RankChoice  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import AudioCancels, Overloaded, SpeechService  # noqa: E402
from vllm_voxserve.transport import AUDIO, END  # noqa: E402
from tests.entrypoints.fake_audio_receiver import FakeReceiver  # noqa: E402


class Params:
    def clone(self):
        return Params()


class RanksEngine:
    """Two-rank engine client: `refusing` maps a rank to its Retry-After; another rank plays one chunk and ends."""

    def __init__(self, receiver, refusing: dict[int, float], size: int = 2, by_limit: bool = False):
        self.receiver, self.refusing, self.by_limit = receiver, refusing, by_limit
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(
            data_parallel_size=size, data_parallel_external_lb=False, data_parallel_hybrid_lb=False))
        self.sent: list[tuple[str, int | None]] = []

    async def generate(self, prompt, params, request_id, data_parallel_rank=None):
        self.sent.append((request_id, data_parallel_rank))
        if data_parallel_rank in self.refusing:
            stop = encode_rejection(self.refusing[data_parallel_rank], f"rank {data_parallel_rank} at capacity",
                                    self.by_limit)
            yield types.SimpleNamespace(finished=True, outputs=[types.SimpleNamespace(stop_reason=stop, token_ids=[])])
            return
        key = request_id.removeprefix("speech-").split("-rank")[0]
        self.receiver.queues[key].put_nowait((AUDIO, np.full(4, data_parallel_rank, np.float32)))
        self.receiver.queues[key].put_nowait((END, None))
        completion = types.SimpleNamespace(stop_reason=None, finish_reason="length", token_ids=[1])
        yield types.SimpleNamespace(finished=True, outputs=[completion])

    async def collective_rpc(self, method, args=()):
        return [{"status": 200}]


def service_on(refusing: dict[int, float]) -> SpeechService:
    service = SpeechService.__new__(SpeechService)  # no checkpoint needed for synthesize()
    service.receiver = FakeReceiver()
    service.engine_client = RanksEngine(service.receiver, refusing)
    service.cancels = AudioCancels(service.engine_client)
    service.ranks = RankChoice(data_parallel_ranks(service.engine_client))
    service.served_models = ["tiny"]
    return service


async def synthesize(service, key: str) -> list[np.ndarray]:
    job = types.SimpleNamespace(stream_key=key, ref_audio=b"")
    return [chunk async for chunk in service.synthesize(job, [0], Params())]


def test_a_refusal_on_one_rank_is_retried_on_the_other():
    service = service_on(refusing={0: 2.0})

    async def run():
        return [await synthesize(service, f"k{i}") for i in range(3)]

    heard = asyncio.run(run())
    assert all(len(chunks) == 1 and chunks[0][0] == 1 for chunks in heard)  # every request served, by rank 1
    sent = service.engine_client.sent
    assert ("speech-k0", 0) in sent or ("speech-k1", 0) in sent  # rank 0 was tried first once at least ...
    assert sum(rank == 0 for _, rank in sent) == 1  # ... and then avoided while its Retry-After lasts
    assert service.ranks.open_streams == [0, 0]


def test_every_rank_refusing_is_a_503_with_the_soonest_retry_after():
    service = service_on(refusing={0: 4.0, 1: 1.5})

    async def run():
        with pytest.raises(Overloaded) as caught:
            await synthesize(service, "k")
        return caught.value

    refused = asyncio.run(run())
    assert refused.retry_after_s == pytest.approx(1.5)
    assert sorted(rank for _, rank in service.engine_client.sent) == [0, 1]
    assert service.ranks.open_streams == [0, 0]


def test_after_every_rank_refused_for_its_requests_in_progress_the_api_server_refuses_arrivals_itself():
    service = service_on(refusing={0: 1.0, 1: 1.0})
    service.engine_client.by_limit = True

    async def run():
        with pytest.raises(Overloaded):
            await synthesize(service, "k")

    asyncio.run(run())
    now = time.monotonic()
    reason, retry_after_s = service.refusal_at_arrival(now)
    assert "0 requests in progress at this API server" in reason and 0 < retry_after_s <= LIMIT_MARK_S
    assert service.refusal_at_arrival(now + LIMIT_MARK_S) is None  # then the engine is asked again
    service.engine_client.by_limit = False
    service.ranks = RankChoice(2)
    asyncio.run(run())  # refused for their load: nothing to answer for the engine
    assert service.refusal_at_arrival(time.monotonic()) is None


def test_one_rank_is_never_steered():
    service = service_on(refusing={})
    service.engine_client.vllm_config.parallel_config.data_parallel_size = 1
    service.ranks = RankChoice(data_parallel_ranks(service.engine_client))

    async def run():
        return await synthesize(service, "k")

    chunks = asyncio.run(run())
    assert len(chunks) == 1 and service.engine_client.sent == [("speech-k", None)]


def test_external_load_balancing_leaves_routing_to_vllm():
    engine = RanksEngine(None, {})
    engine.vllm_config.parallel_config.data_parallel_external_lb = True
    assert data_parallel_ranks(engine) == 1


def test_an_engines_refusal_is_answered_for_it_only_where_this_api_server_knows_which_engine_comes_next():
    parallel = RanksEngine(None, {}).vllm_config.parallel_config
    steered = RanksEngine(None, {})
    assert steers_every_engine(steered) and data_parallel_ranks(steered) == 2  # each rank steered from here
    parallel.data_parallel_size = 1
    assert steers_every_engine(types.SimpleNamespace(vllm_config=types.SimpleNamespace(parallel_config=parallel)))
    for external, hybrid, local, known in ((True, False, 1, True), (False, True, 1, True), (False, True, 2, False),
                                           (True, False, 0, False)):
        engine = RanksEngine(None, {})
        config = engine.vllm_config.parallel_config
        config.data_parallel_external_lb, config.data_parallel_hybrid_lb = external, hybrid
        config.data_parallel_size_local = local
        assert steers_every_engine(engine) is known, (external, hybrid, local)
    unsteerable = types.SimpleNamespace(vllm_config=RanksEngine(None, {}).vllm_config)  # generate() without a rank
    assert not steers_every_engine(unsteerable)
    ranks = RankChoice(1, refuse_at_limit=False)  # vLLM routes among engines: the next may have room
    ranks.opened(0)
    ranks.refused(0, now=0.0, retry_after_s=1.0, by_limit=True)
    assert ranks.at_limit(0.0) is None


class DataParallelClient:
    """What `collective_rpc_per_rank` uses of vLLM's DP client: each engine answers for itself."""

    def __init__(self, replies_by_engine: dict[bytes, list[dict]]):
        self.core_engines = list(replies_by_engine)
        self.replies = replies_by_engine

    async def _call_utility_async(self, method, rpc_method, timeout, args, kwargs, engine):
        assert method == "collective_rpc"
        return self.replies[engine]


def test_rpcs_reach_every_rank_and_report_each_ranks_replies():
    engine = RanksEngine(None, {})
    engine.engine_core = DataParallelClient({b"\x00\x00": [{"status": 200, "current": "a"}],
                                             b"\x01\x00": [{"status": 409, "error": "busy"}]})
    per_rank = asyncio.run(collective_rpc_per_rank(engine, "voxserve_codec_mode", ("b",)))
    assert per_rank == [[{"status": 200, "current": "a"}], [{"status": 409, "error": "busy"}]]
    single = RanksEngine(None, {}, size=1)
    assert asyncio.run(collective_rpc_per_rank(single, "voxserve_stats")) == [[{"status": 200}]]


def test_ranks_counters_merge_into_one_snapshot():
    one = {"codec_batches": {"background": {"4": 2}}, "codec_busy_s": {"background": 3.0}, "backbone_frames": 10,
           "backbone_busy_s": 1.0}
    two = {"codec_batches": {"background": {"4": 1, "8": 5}, "urgent": {"1": 7}},
           "codec_busy_s": {"background": 1.0, "urgent": 2.0}, "backbone_frames": 30, "backbone_busy_s": 3.0}
    merged = merge_rank_snapshots([one, two])
    assert merged["codec_batches"] == {"background": {"4": 3, "8": 5}, "urgent": {"1": 7}}
    assert merged["codec_busy_s"] == {"background": 2.0, "urgent": 1.0}  # the ranks' mean: a fraction stays <= 1
    assert merged["backbone_frames"] == 40
    assert merge_rank_snapshots([one]) is one
