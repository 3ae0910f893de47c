import random

import pytest
import torch

from tests.codec_lanes.toy_codec import ToyCodec, decode_alone, random_codes
from vllm_voxserve.codec_lanes import CodecChunk, LaneConfig, LaneKind, LaneManager, cpu_partitions
from vllm_voxserve.models.batch_sizes import powers_of_two_up_to, powers_then_multiples, smallest_at_least
from vllm_voxserve.codec_lanes.lane_manager import SlotAllocator
from vllm_voxserve.models.program import CodecProgram, CodecStatePool, sample_rate

FRAMES = 4


@pytest.fixture
def codec():
    return ToyCodec()


def make_manager(codec, **kw):
    got = []
    config = LaneConfig(**{"max_requests": 8, "frame_counts": (FRAMES,), "background_max_batch": 8, **kw})
    return LaneManager(codec, cpu_partitions(), config, got.append), got


def utterance(codec, n_chunks, seed, last_frames=FRAMES):
    return [random_codes(last_frames if i == n_chunks - 1 else FRAMES, codec, seed * 100 + i)
            for i in range(n_chunks)]


def test_toy_codec_implements_protocol_and_is_stateful(codec):
    assert isinstance(codec, CodecProgram)
    assert isinstance(codec.make_state_pool(2, torch.device("cpu")), CodecStatePool)
    assert sample_rate(codec) == 200
    chunks = utterance(codec, 3, seed=1)
    whole = decode_alone(codec, [torch.cat(chunks)])
    assert torch.allclose(decode_alone(codec, chunks), whole, atol=1e-5)
    # the state matters: the last chunk decoded from a fresh state sounds different
    assert not torch.allclose(decode_alone(codec, chunks[-1:]), whole[-FRAMES * 16:], atol=1e-3)


def test_any_grouping_on_either_lane_equals_each_request_alone(codec):
    mgr, got = make_manager(codec)
    rng = random.Random(0)
    utts = {f"r{i}": utterance(codec, rng.randint(1, 4), seed=i, last_frames=rng.randint(1, FRAMES))
            for i in range(6)}
    for rid in utts:
        mgr.open_request(rid)
    pending = {rid: 0 for rid in utts}
    while pending:
        kind = rng.choice(list(LaneKind))
        ready = [r for r in pending if mgr.can_dispatch(r)]
        batch = rng.sample(ready, rng.randint(1, min(len(ready), mgr.max_batch(kind))))
        chunks = []
        for rid in batch:
            i = pending[rid]
            chunks.append(CodecChunk(rid, i, utts[rid][i], is_last=i == len(utts[rid]) - 1))
            pending[rid] += 1
            if pending[rid] == len(utts[rid]):
                del pending[rid]
        mgr.submit(kind, chunks)
        mgr.poll()
    mgr.drain()
    lanes_used = {c.lane for c in got}
    assert lanes_used == set(LaneKind)
    for rid, chunks in utts.items():
        mine = sorted((c for c in got if c.request_id == rid), key=lambda c: c.chunk_index)
        assert [c.chunk_index for c in mine] == list(range(len(chunks)))
        assert mine[-1].is_last
        assert torch.allclose(torch.cat([c.audio for c in mine]), decode_alone(codec, chunks), atol=1e-5)
    assert mgr.slots.num_free == 8  # every finished request gave its slot back


def test_next_chunk_waits_for_previous_and_comes_in_order(codec):
    mgr, got = make_manager(codec)
    mgr.open_request("a")
    c0, c1, c2 = utterance(codec, 3, seed=3)
    with pytest.raises(ValueError, match="chunk 1 submitted, 0 expected"):
        mgr.submit(LaneKind.URGENT, [CodecChunk("a", 1, c1)])
    mgr.submit(LaneKind.URGENT, [CodecChunk("a", 0, c0)])
    assert not mgr.can_dispatch("a")
    with pytest.raises(ValueError, match="in flight on the urgent lane"):
        mgr.submit(LaneKind.BACKGROUND, [CodecChunk("a", 1, c1)])
    assert mgr.poll() == 1 and mgr.can_dispatch("a")
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk("a", 1, c1)])
    mgr.poll()
    mgr.submit(LaneKind.URGENT, [CodecChunk("a", 2, c2, is_last=True)])
    mgr.poll()
    assert [c.lane for c in got] == [LaneKind.URGENT, LaneKind.BACKGROUND, LaneKind.URGENT]


def test_busy_lane_and_bad_batches_are_refused(codec):
    mgr, _ = make_manager(codec, urgent_buckets=(1, 2))
    for rid in "abc":
        mgr.open_request(rid)
    c = random_codes(FRAMES, codec, 0)
    with pytest.raises(ValueError, match="does not fit"):
        mgr.submit(LaneKind.URGENT, [CodecChunk(r, 0, c) for r in "abc"])
    with pytest.raises(ValueError, match="one chunk per request"):
        mgr.submit(LaneKind.URGENT, [CodecChunk("a", 0, c), CodecChunk("a", 1, c)])
    with pytest.raises(ValueError, match="only a last chunk"):
        mgr.submit(LaneKind.URGENT, [CodecChunk("a", 0, c[:2])])
    with pytest.raises(ValueError, match="not open"):
        mgr.submit(LaneKind.URGENT, [CodecChunk("zz", 0, c)])
    mgr.submit(LaneKind.URGENT, [CodecChunk("a", 0, c)])
    with pytest.raises(RuntimeError, match="busy"):
        mgr.submit(LaneKind.URGENT, [CodecChunk("b", 0, c)])
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk("b", 0, c), CodecChunk("c", 0, c)])  # the other lane is free
    assert not mgr.is_idle(LaneKind.BACKGROUND)
    assert mgr.poll() == 3 and mgr.is_idle(LaneKind.URGENT) and mgr.is_idle(LaneKind.BACKGROUND)
    costs = mgr.take_batch_costs()
    assert sorted((c.lane.value, c.size) for c in costs) == [("background", 2), ("urgent", 1)]
    assert all(c.seconds > 0 for c in costs) and mgr.take_batch_costs() == []


def test_the_background_lane_queues_a_second_batch_in_its_own_buffers(codec):
    """Depth 2: a batch launches while another is in flight (on CPU both have run at launch, so a shared output
    buffer would hand the first batch the second's audio); a third waits; batches come back in launch order."""
    mgr, got = make_manager(codec)
    utts = {rid: utterance(codec, 2, seed=10 + i) for i, rid in enumerate("abcd")}
    for rid in utts:
        mgr.open_request(rid)
    lane = mgr.lanes[LaneKind.BACKGROUND]
    harvest = lane.harvest
    lane.harvest = lambda block=False: harvest(block) if block else None  # in flight until a blocking poll
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk("a", 0, utts["a"][0]), CodecChunk("b", 0, utts["b"][0])])
    assert mgr.can_launch(LaneKind.BACKGROUND) and not mgr.is_idle(LaneKind.BACKGROUND)
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk("c", 0, utts["c"][0])])
    assert not mgr.can_launch(LaneKind.BACKGROUND)
    with pytest.raises(RuntimeError, match="busy"):
        mgr.submit(LaneKind.BACKGROUND, [CodecChunk("d", 0, utts["d"][0])])
    mgr.submit(LaneKind.URGENT, [CodecChunk("d", 0, utts["d"][0])])  # the urgent lane: depth 1, still free
    assert not mgr.can_launch(LaneKind.URGENT)
    assert mgr.poll() == 1  # the urgent batch; the background ones are held
    assert mgr.drain() == 3 and mgr.is_idle(LaneKind.BACKGROUND)
    assert [(c.request_id, c.lane) for c in got[1:]] == [("a", LaneKind.BACKGROUND), ("b", LaneKind.BACKGROUND),
                                                           ("c", LaneKind.BACKGROUND)]
    for rid in "abc":
        mgr.submit(LaneKind.BACKGROUND, [CodecChunk(rid, 1, utts[rid][1], is_last=True)])
        mgr.drain()
    mgr.submit(LaneKind.URGENT, [CodecChunk("d", 1, utts["d"][1], is_last=True)])
    mgr.drain()
    for rid, chunks in utts.items():
        mine = [c.audio for c in got if c.request_id == rid]
        assert torch.allclose(torch.cat(mine), decode_alone(codec, chunks), atol=1e-5), rid
    assert [c.size for c in mgr.take_batch_costs() if c.lane is LaneKind.BACKGROUND] == [2, 1, 1, 1, 1]
    assert mgr.slots.num_free == 8


def test_closed_request_drops_audio_and_its_reused_slot_starts_fresh(codec):
    mgr, got = make_manager(codec, max_requests=1)
    first = utterance(codec, 2, seed=5)
    mgr.open_request("old")
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk("old", 0, first[0])])
    mgr.close_request("old")  # aborted while its chunk runs: the slot stays taken until harvest
    with pytest.raises(RuntimeError, match="no free codec state slot"):
        mgr.open_request("new")
    assert mgr.poll() == 0 and got == []
    second = utterance(codec, 2, seed=6)
    mgr.open_request("new")  # same slot, with the old request's state in it until reset
    for i, c in enumerate(second):
        mgr.submit(LaneKind.URGENT, [CodecChunk("new", i, c, is_last=i == 1)])
        mgr.poll()
    assert torch.allclose(torch.cat([c.audio for c in got]), decode_alone(codec, second), atol=1e-5)
    mgr.close_request("new")  # already released after its last chunk: a no-op


def test_bucket_helpers_and_slot_allocator():
    assert powers_of_two_up_to(48) == (1, 2, 4, 8, 16, 32, 48)
    assert powers_of_two_up_to(1) == (1,)
    assert powers_then_multiples(64, 8) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert powers_then_multiples(20, 6) == (1, 2, 4, 6, 12, 18, 20)  # the largest batch stays the largest size
    assert powers_then_multiples(48, 0) == powers_of_two_up_to(48)
    with pytest.raises(ValueError):
        powers_then_multiples(8, -1)
    assert smallest_at_least((1, 2, 4, 8), 3) == 4
    with pytest.raises(ValueError):
        smallest_at_least((1, 2), 3)
    slots = SlotAllocator(2)
    assert [slots.allocate(), slots.allocate()] == [0, 1]
    slots.free(0)
    assert slots.allocate() == 0


def test_a_bucket_step_bounds_a_background_batchs_padding_and_keeps_its_audio(codec):
    mgr, got = make_manager(codec, max_requests=16, background_max_batch=16, background_bucket_step=4)
    lane = mgr.lanes[LaneKind.BACKGROUND]
    assert lane.executables.buckets == (1, 2, 4, 8, 12, 16)
    assert mgr.lanes[LaneKind.URGENT].executables.buckets == (1, 2, 4, 8, 16, 32)  # the urgent lane keeps its own
    buckets_run = []
    for exe in lane._sets:
        exe.run = lambda bucket, frames, run=exe.run: (buckets_run.append(bucket), run(bucket, frames))[1]
    utts = {f"r{i}": utterance(codec, 1, seed=40 + i) for i in range(9)}
    for rid in utts:
        mgr.open_request(rid)
    mgr.submit(LaneKind.BACKGROUND, [CodecChunk(rid, 0, u[0], is_last=True) for rid, u in utts.items()])
    assert mgr.drain() == 9 and buckets_run == [12]  # 9 chunks run as 12, not as 16
    (cost,) = mgr.take_batch_costs()
    assert (cost.lane, cost.size, cost.rows) == (LaneKind.BACKGROUND, 9, 12)  # the step log's padded rows
    for rid, chunks in utts.items():
        (mine,) = [c for c in got if c.request_id == rid]
        assert torch.allclose(mine.audio, decode_alone(codec, chunks), atol=1e-5)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        LaneConfig(max_requests=0)
    with pytest.raises(ValueError):
        LaneConfig(frame_counts=())
    with pytest.raises(ValueError):
        LaneConfig(background_max_batch=0)
    with pytest.raises(ValueError):
        LaneConfig(background_depth=0)
    for step in (-8, True, 2.5):
        with pytest.raises(ValueError, match="background_bucket_step must be a positive integer"):
            LaneConfig(background_bucket_step=step)
