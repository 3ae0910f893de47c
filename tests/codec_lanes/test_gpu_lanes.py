"""GPU tests of the codec lanes (one H200): partitions, graphs, batching equivalence, urgent latency.

Run: PYTHONUNBUFFERED=1 python -m pytest -q -m gpu tests/codec_lanes -s
Set VOXSERVE_GPU_REPORT=<file> to also append each test's measured numbers there as JSON lines.
"""

import json
import os
import random
import statistics
import time

import pytest
import torch

from tests.codec_lanes.toy_codec import ToyCodec, decode_alone, random_codes
from vllm_voxserve.codec_lanes import CodecChunk, LaneConfig, LaneKind, LaneManager, SplitSpec, create_partitions

pytestmark = pytest.mark.gpu

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:

    @triton.jit
    def _smid_kernel(out_ptr, iters):
        pid = tl.program_id(0)
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
        x = pid.to(tl.float32)
        for _ in range(iters):  # stay resident long enough that blocks spread over every SM allowed
            x = x * 0.999999 + 0.5
        tl.store(out_ptr + pid, sm + (x < -1.0).to(tl.int32))


BLOCKS, SPIN = 2048, 20000


def report(name, **values):
    line = json.dumps({"test": name, **values})
    print(line)
    path = os.environ.get("VOXSERVE_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@pytest.fixture(scope="module")
def parts():
    # Kept alive to the end of the process: graphs captured on these streams must not outlive them.
    return create_partitions(SplitSpec("codec", 24))


def smids(stream) -> set[int]:
    out = torch.full((BLOCKS,), -1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        _smid_kernel[(BLOCKS,)](out, SPIN)
    torch.cuda.synchronize()
    return set(out.tolist())


def graph_smids(capture_stream, launch_stream):
    """SMs a probe graph captured on capture_stream runs on when replayed on launch_stream."""
    out = torch.full((BLOCKS,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(capture_stream):
        _smid_kernel[(BLOCKS,)](out, SPIN)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        _smid_kernel[(BLOCKS,)](out, SPIN)
    return replay_smids(graph, out, launch_stream), graph, out


def replay_smids(graph, out, stream):
    out.fill_(-1)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        graph.replay()
    torch.cuda.synchronize()
    return set(out.tolist())


def driver_launch_smids(graph, out, stream) -> str:
    """For the record: does cuGraphLaunch on a green stream run the graph? (torch's replay does not.)"""
    from cuda.bindings import driver as drv

    out.fill_(-1)
    torch.cuda.synchronize()
    err = drv.cuGraphLaunch(drv.CUgraphExec(graph.raw_cuda_graph_exec()), drv.CUstream(stream.cuda_stream))[0]
    torch.cuda.synchronize()
    return f"{err.name}: {len(set(out.tolist()) - {-1})} SMs"


def test_partitions_use_disjoint_sms_and_graphs_stay_on_their_partition(parts):
    assert parts.codec_sms >= 24 and parts.lm_sms + parts.codec_sms <= parts.total_sms
    full, codec, lm = smids(parts.urgent_stream), smids(parts.codec_stream), smids(parts.lm_stream)
    assert -1 not in full | codec | lm
    assert len(full) == parts.total_sms
    assert len(codec) == parts.codec_sms and len(lm) == parts.lm_sms
    assert not codec & lm and codec | lm <= full
    codec_graph, g1, out1 = graph_smids(parts.codec_stream, parts.codec_launch_stream)
    lm_graph, g2, out2 = graph_smids(parts.lm_stream, parts.lm_launch_stream)
    urgent_graph, g3, _ = graph_smids(parts.urgent_stream, parts.urgent_stream)
    assert codec_graph == codec and lm_graph == lm and urgent_graph == full
    on_green = replay_smids(g1, out1, parts.codec_stream)  # the quirk partitions.py works around
    try:
        driver_green = driver_launch_smids(g2, out2, parts.lm_stream)
    except Exception as exc:  # informational only
        driver_green = repr(exc)
    report("partitions", total_sms=parts.total_sms, lm_sms=parts.lm_sms, codec_sms=parts.codec_sms,
           urgent_stream_sms=len(full), codec_stream_sms=len(codec), lm_stream_sms=len(lm),
           overlap=len(codec & lm), codec_graph_sms=len(codec_graph), lm_graph_sms=len(lm_graph),
           urgent_graph_sms=len(urgent_graph), urgent_priority=parts.urgent_stream.priority,
           torch_replay_on_green_stream_sms=len(on_green - {-1}), driver_launch_on_green_stream=driver_green)


def _pick_batch(rng, ready, utts, pending, max_batch):
    """A random batch whose chunks share one frame count (a shorter chunk only if it is a last one)."""
    rng.shuffle(ready)
    frames = None
    batch = []
    for rid in ready:
        i = pending[rid]
        n, last = utts[rid][i].shape[0], i == len(utts[rid]) - 1
        size = 2 if n <= 2 else 4
        if frames is None:
            frames = size
        if n == frames or (last and n <= frames):
            batch.append((rid, i, last))
        if len(batch) == max_batch:
            break
    return batch[: rng.randint(1, len(batch))]


@torch.no_grad()
def test_any_grouping_on_either_lane_equals_each_request_alone(parts):
    torch.backends.cuda.matmul.allow_tf32 = False
    codec = ToyCodec(channels=64, layers=3).cuda()
    got = []
    mgr = LaneManager(codec, parts, LaneConfig(max_requests=16, frame_counts=(2, 4), background_max_batch=8),
                      got.append)
    rng = random.Random(0)
    utts = {}
    for r in range(12):  # a 2-frame first chunk, 4-frame chunks, a last chunk of 1-4 frames
        n = rng.randint(1, 5)
        lens = ([2] + [4] * (n - 2) + [rng.randint(1, 4)])[-n:] if n > 1 else [rng.randint(1, 2)]
        utts[f"r{r}"] = [random_codes(f, codec, r * 100 + j) for j, f in enumerate(lens)]
        mgr.open_request(f"r{r}")
    pending = {rid: 0 for rid in utts}
    # a finished background batch is left unharvested half the time, so the next one queues behind it (depth 2)
    background = mgr.lanes[LaneKind.BACKGROUND]
    harvest = background.harvest
    background.harvest = lambda block=False: harvest(block) if block or rng.random() < 0.5 else None
    batch_sizes = {k: [] for k in LaneKind}
    queued_behind = 0  # background batches launched while another ran (the lane's depth 2: own buffers and graphs)
    deadline = time.monotonic() + 60
    while pending or not all(mgr.is_idle(k) for k in LaneKind):
        assert time.monotonic() < deadline
        mgr.poll()
        for kind in LaneKind:
            ready = [r for r in pending if mgr.can_dispatch(r)]
            if not mgr.can_launch(kind) or not ready:
                continue
            queued_behind += kind is LaneKind.BACKGROUND and not mgr.is_idle(kind)
            batch = _pick_batch(rng, ready, utts, pending, mgr.max_batch(kind))
            chunks = []
            for rid, i, last in batch:
                codes = utts[rid][i].cuda() if rng.random() < 0.5 else utts[rid][i]  # both input paths
                chunks.append(CodecChunk(rid, i, codes, is_last=last))
                pending[rid] += 1
                if last:
                    del pending[rid]
            mgr.submit(kind, chunks)
            batch_sizes[kind].append(len(chunks))
    worst = 0.0
    for rid, chunks in utts.items():
        mine = sorted((c for c in got if c.request_id == rid), key=lambda c: c.chunk_index)
        assert [c.chunk_index for c in mine] == list(range(len(chunks)))
        ref = decode_alone(codec, chunks, torch.device("cuda"))
        worst = max(worst, (torch.cat([c.audio for c in mine]) - ref).abs().max().item())
    assert worst < 1e-4
    assert max(batch_sizes[LaneKind.URGENT]) > 1 and max(batch_sizes[LaneKind.BACKGROUND]) > 1
    assert queued_behind > 0
    report("grouping_equivalence", requests=len(utts), chunks=len(got), max_abs_diff=worst, queued_behind=queued_behind,
           urgent_batches=batch_sizes[LaneKind.URGENT], background_batches=batch_sizes[LaneKind.BACKGROUND])


def _wait(mgr, done, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while not done():
        mgr.poll()
        assert time.monotonic() < end, "timed out"


class HeavyLanes:
    """A bf16 toy codec heavy enough that a background batch of 128 chunks runs for tens of ms."""

    def __init__(self, parts):
        self.codec = ToyCodec(codes_per_frame=4, vocab=64, channels=4096, layers=16, samples_per_frame=1920,
                              dtype=torch.bfloat16, device="cuda")
        self.mgr = LaneManager(self.codec, parts, LaneConfig(max_requests=160, frame_counts=(10,),
                                                              background_max_batch=128), lambda chunk: None)
        self.bg = [f"bg{i}" for i in range(128)]
        for rid in self.bg:
            self.mgr.open_request(rid)
        self.bg_codes = [random_codes(10, self.codec, i) for i in range(128)]
        self.urgent_codes = random_codes(10, self.codec, 999)
        self.n_urgent = 0
        self.bg_round = 0

    def urgent_ms(self) -> float:
        """Host time from submitting one urgent chunk (a new request's first) to its audio."""
        rid = f"u{self.n_urgent}"
        self.n_urgent += 1
        self.mgr.open_request(rid)
        t = time.perf_counter()
        self.mgr.submit(LaneKind.URGENT, [CodecChunk(rid, 0, self.urgent_codes)])
        _wait(self.mgr, lambda: self.mgr.can_dispatch(rid))
        ms = (time.perf_counter() - t) * 1000
        self.mgr.close_request(rid)
        return ms

    def submit_background(self) -> None:
        k, self.bg_round = self.bg_round, self.bg_round + 1
        self.mgr.submit(LaneKind.BACKGROUND, [CodecChunk(rid, k, self.bg_codes[i]) for i, rid in enumerate(self.bg)])

    def background_running(self) -> bool:
        return not self.mgr.is_idle(LaneKind.BACKGROUND)

    def wait_background(self) -> None:
        _wait(self.mgr, lambda: not self.background_running())

    def background_ms(self) -> float:
        t = time.perf_counter()
        self.submit_background()
        self.wait_background()
        return (time.perf_counter() - t) * 1000


@pytest.fixture(scope="module")
def heavy(parts):
    lanes = HeavyLanes(parts)
    lanes.background_ms(), lanes.urgent_ms()  # first replays
    return lanes


@torch.no_grad()
def test_urgent_chunk_does_not_wait_behind_a_large_background_batch(parts, heavy):
    idle = statistics.median(heavy.urgent_ms() for _ in range(5))
    heavy.mgr.take_batch_costs()
    alone = statistics.median(heavy.background_ms() for _ in range(3))
    device_ms = [c.seconds * 1000 for c in heavy.mgr.take_batch_costs()]  # CUDA-event time of each batch
    assert len(device_ms) == 3 and all(0.5 * alone < ms < 1.25 * alone for ms in device_ms)
    busy, overtook, submit_ms = [], [], []
    for _ in range(5):
        t = time.perf_counter()
        heavy.submit_background()  # must only queue work: the host goes on while the batch runs
        submit_ms.append((time.perf_counter() - t) * 1000)
        time.sleep(0.002)  # the batch is running on the codec partition
        busy.append(heavy.urgent_ms())
        overtook.append(heavy.background_running())
        heavy.wait_background()
    # For the record (not asserted): the LM partition saturated by matmuls at the same time.
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with_lm = []
    for _ in range(3):
        parts.lm_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(parts.lm_stream):
            for _ in range(40):
                a @ a
        heavy.submit_background()
        time.sleep(0.002)
        with_lm.append(heavy.urgent_ms())
        heavy.wait_background()
        torch.cuda.synchronize()
    busy_median = statistics.median(busy)
    report("urgent_under_background", urgent_idle_ms=idle, background_batch128_alone_ms=alone,
           background_batch128_device_ms=device_ms,
           urgent_during_background_ms=busy, urgent_during_background_and_lm_load_ms=with_lm,
           background_still_running_when_urgent_done=overtook, background_submit_host_ms=submit_ms)
    assert all(overtook)
    assert max(submit_ms) < 0.2 * alone
    assert busy_median < 0.25 * alone
    assert busy_median < max(3 * idle, idle + 2.0)


def toy_backbone(layers=12, width=2048):
    """make_step(batch) for a memory-bound stand-in of a backbone decode step (about 0.8 GB of bf16 weights)."""
    w_in = torch.randn(layers, width, 4 * width, device="cuda", dtype=torch.bfloat16) * width ** -0.5
    w_out = torch.randn(layers, 4 * width, width, device="cuda", dtype=torch.bfloat16) * (4 * width) ** -0.5

    def make_step(batch):
        x = torch.randn(batch, width, device="cuda", dtype=torch.bfloat16)

        def step():
            h = x
            for i in range(layers):
                h = h + torch.relu(h @ w_in[i]) @ w_out[i]
            return h

        return step

    return make_step


@torch.no_grad()
def test_lm_steps_keep_going_while_a_background_batch_runs(parts, heavy):
    from vllm_voxserve.codec_lanes.executables import capture_step_graphs

    graph = capture_step_graphs(toy_backbone(), [64], parts.lm_stream)[64]  # fixed to the LM partition
    parts.lm_launch_stream.wait_stream(torch.cuda.current_stream())

    def step_ms():  # what the worker does per step: launch, then poll the codec lanes until the step is done
        t = time.perf_counter()
        with torch.cuda.stream(parts.lm_launch_stream):  # replayed from the primary context: on the LM SMs
            graph.replay()
            done = torch.cuda.Event()
            done.record()
        while not done.query():
            heavy.mgr.poll()
        return (time.perf_counter() - t) * 1000

    [step_ms() for _ in range(5)]
    alone = statistics.median(step_ms() for _ in range(20))
    heavy.submit_background()
    t = time.perf_counter()
    during = []
    while heavy.background_running():
        during.append(step_ms())
    batch_ms = (time.perf_counter() - t) * 1000
    report("lm_steps_during_background", step_alone_ms=alone, steps_during_batch=len(during),
           step_during_batch_median_ms=statistics.median(during), background_batch128_ms=batch_ms)
    assert len(during) >= 5  # the batch spanned several backbone steps, which kept going
    assert statistics.median(during) < 2 * alone
