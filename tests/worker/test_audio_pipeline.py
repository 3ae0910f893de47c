"""AudioPipeline on CPU with the tiny Qwen3 codec, in both codec modes, without a vLLM server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_voxserve.codec_lanes import LaneKind
from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_codec_decoder, make_random_speech_tokenizer
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram
from vllm_voxserve.worker.audio_pipeline import AudioPipeline, CodecModeBusy
from vllm_voxserve.worker.rpc import codec_mode_call

FIRST, LATER, B = 4, 3, 3  # chunk sizes in frames; background batch size


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speech_tokenizer")
    make_random_speech_tokenizer(folder, "tiny", 0, torch.float32)
    return Qwen3CodecProgram(load_codec_decoder(folder, torch.float32))


class FakeSender:
    def __init__(self):
        self.messages: list[tuple[str, str, int, object]] = []

    def send_audio(self, address, stream_key, seq, pcm):
        self.messages.append(("audio", stream_key, seq, np.array(pcm, dtype=np.float32)))

    def send_end(self, address, stream_key, seq):
        self.messages.append(("end", stream_key, seq, None))

    def send_error(self, address, stream_key, seq, message):
        self.messages.append(("error", stream_key, seq, message))

    def of(self, key):
        return [m for m in self.messages if m[1] == key]


class FrozenClock:
    """Time stands still, so the only deadline pressure is the policy's rules, not the test machine's speed."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_pipeline(program, mode, **overrides):
    config = VoxServeConfig.from_tree({"codec_mode": mode, "first_chunk_frames": FIRST, "chunk_frames": LATER,
                                       "max_codec_slots": 8, "scheduler": {"background_min_batch": B},
                                       **overrides})
    sender = FakeSender()
    pipeline = AudioPipeline(program, config, sender, torch.device("cpu"), clock=FrozenClock())
    launches = []
    if pipeline.lanes is not None:
        manager, submit = pipeline.lanes.manager, pipeline.lanes.manager.submit

        def spy(kind, chunks):
            generating = any(not r.state.generation_done for r in pipeline.lanes.requests.values())
            launches.append((kind, [(c.request_id, c.chunk_index) for c in chunks], generating))
            submit(kind, chunks)

        manager.submit = spy
    return pipeline, sender, launches


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def full_decode(program, codes: torch.Tensor) -> np.ndarray:
    return program.decoder(codes.T[None])[0, 0].float().cpu().numpy()


def num_chunks(frames: int) -> int:
    return 0 if frames == 0 else 1 + -(-(frames - FIRST) // LATER) if frames > FIRST else 1


def check_stream(sender, key, expected_audio, chunks):
    """Audio messages 0..chunks-1 in order, then END; their concatenation is the request's full decode."""
    got = sender.of(key)
    assert [m[0] for m in got] == ["audio"] * chunks + ["end"], [m[0] for m in got]
    assert [m[2] for m in got] == list(range(chunks + 1))
    audio = np.concatenate([m[3] for m in got[:-1]]) if chunks else np.zeros(0, np.float32)
    assert audio.shape == expected_audio.shape
    np.testing.assert_allclose(audio, expected_audio, atol=1e-4)


def run_interleaved(pipeline, lengths: dict[str, int], starts: dict[str, int]):
    """Each step: open the requests starting now, close those that ran out (as vLLM does at the next step), push
    one frame for each live request (two for every third request on even steps, in a rotating order)."""
    codes = {r: random_codes(n, seed=i) for i, (r, n) in enumerate(lengths.items())}
    made = dict.fromkeys(lengths, 0)
    live: list[str] = []
    step = 0
    while made != lengths or live:
        for r, s in starts.items():
            if s == step:
                pipeline.open(r, f"key-{r}", "addr")
                live.append(r)
        for r in [r for r in live if made[r] == lengths[r]]:
            pipeline.close(r)
            live.remove(r)
        frames, ids = [], []
        order = live[step % len(live):] + live[: step % len(live)] if live else []
        for i, r in enumerate(order):
            for _ in range(2 if (step % 2 == 0 and i % 3 == 0) else 1):
                if made[r] < lengths[r]:
                    frames.append(codes[r][made[r]])
                    ids.append(r)
                    made[r] += 1
        if frames:
            pipeline.push(torch.stack(frames), ids)
        if pipeline.lanes is not None:  # the step log's backlog counter agrees with the queues
            assert pipeline.lanes.queued_chunks == sum(len(q.queue) for q in pipeline.lanes.requests.values())
        step += 1
    return codes


LENGTHS = {"a": 14, "b": 8, "c": 4, "d": 11, "e": 2}  # partial last chunks (a, d, e), exact ones (b, c)
STARTS = {"a": 0, "b": 0, "c": 1, "d": 2, "e": 5}


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_interleaved_requests_get_their_full_decode_in_order_then_end(program, mode):
    pipeline, sender, _ = make_pipeline(program, mode)
    codes = run_interleaved(pipeline, LENGTHS, STARTS)
    for r, n in LENGTHS.items():
        check_stream(sender, f"key-{r}", full_decode(program, codes[r]), num_chunks(n))
    assert not pipeline.streams
    if mode == "lanes":
        assert not pipeline.lanes.busy and pipeline.lanes.queued_chunks == 0
        assert pipeline.lanes.manager.slots.num_free == 8


def test_first_chunks_go_to_the_urgent_lane_and_background_batches_wait_for_b(program):
    pipeline, sender, launches = make_pipeline(program, "lanes")
    run_interleaved(pipeline, LENGTHS, STARTS)
    urgent = [c for kind, chunks, _ in launches if kind is LaneKind.URGENT for c in chunks]
    assert sorted(urgent) == sorted((r, 0) for r in LENGTHS)  # time stands still: nothing else is urgent
    background = [(chunks, generating) for kind, chunks, generating in launches if kind is LaneKind.BACKGROUND]
    while_generating = [chunks for chunks, generating in background if generating]
    assert while_generating, "no background batch launched while the LM was generating"
    assert all(len(chunks) >= B for chunks in while_generating), while_generating
    # once nothing generates, the rest goes at once, smaller batches included
    assert any(len(chunks) < B for chunks, generating in background if not generating)
    launched = sorted(c for _, chunks, _ in launches for c in chunks)
    assert launched == sorted((r, k) for r, n in LENGTHS.items() for k in range(num_chunks(n)))


def test_the_served_lanes_take_every_configured_executable_field(program):
    pipeline, _, _ = make_pipeline(program, "lanes", lanes={"urgent_buckets": [1, 4], "background_max_batch": 32,
                                                            "background_bucket_step": 8, "background_depth": 3})
    lanes = pipeline.lanes.manager.lanes
    assert lanes[LaneKind.URGENT].executables.buckets == (1, 4)
    assert lanes[LaneKind.BACKGROUND].executables.buckets == (1, 2, 4, 8, 16, 24, 32)
    assert lanes[LaneKind.BACKGROUND].depth == 3


def test_a_small_background_batch_launches_early_when_its_deadline_nears(program):
    pipeline, sender, launches = make_pipeline(program, "lanes")
    codes = random_codes(FIRST + LATER, seed=3)
    other = random_codes(1, seed=4)
    pipeline.open("a", "key-a", "addr")
    pipeline.open("b", "key-b", "addr")  # keeps generating: the LM is not idle
    pipeline.push(codes[:FIRST], ["a"] * FIRST)
    pipeline.push(codes[FIRST:], ["a"] * LATER)
    assert [k for k, _, _ in launches] == [LaneKind.URGENT]  # chunk 1 waits for company
    pipeline.clock.now += FIRST * 0.08 - 0.15  # chunk 1's deadline is 150 ms away: within δu + the lead
    pipeline.push(other, ["b"])
    assert launches[-1][:2] == (LaneKind.BACKGROUND, [("a", 1)])
    assert [m[0] for m in sender.of("key-a")] == ["audio", "audio"]


def hold_lane_batches(pipeline):
    """Make the CPU lanes behave like GPU ones: a launched batch stays in flight until released (or a blocking
    poll waits for it). Returns the switch."""
    gate = {"open": False}
    for lane in pipeline.lanes.manager.lanes.values():
        harvest = lane.harvest

        def held(block=False, harvest=harvest):
            return harvest(block=False) if block or gate["open"] else None

        lane.harvest = held
    return gate


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_codes_past_the_codebook_are_clamped_in_every_chunk(program, mode):
    """A talker's codebook-0 id past the codec's 2048 entries (a special token) decodes as code 2047, in full chunks
    and in the last, shorter one."""
    pipeline, sender, _ = make_pipeline(program, mode)
    codes = random_codes(FIRST + LATER + 2, seed=31)
    codes[::3, 0] = 3000
    pipeline.open("a", "key-a", "addr")
    pipeline.push(codes, ["a"] * len(codes))
    pipeline.close("a")
    check_stream(sender, "key-a", full_decode(program, codes.clamp(0, 2047)), 3)


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_reference_warm_up_is_decoded_unheard(program, mode):
    pipeline, sender, _ = make_pipeline(program, mode)
    ref, gen = random_codes(7, seed=9), random_codes(FIRST + LATER, seed=10)
    pipeline.open("a", "key-a", "addr", warmup_codes=ref)
    pipeline.push(gen, ["a"] * len(gen))
    pipeline.close("a")
    whole = full_decode(program, torch.cat([ref, gen]))
    check_stream(sender, "key-a", whole[len(ref) * program.samples_per_frame:], 2)


def test_a_warm_up_that_fails_leaves_the_inline_codecs_slot_free(program):
    class FailingDecode:  # the program, except that its decode raises
        def __getattr__(self, name):
            return getattr(program, name)

        def decode(self, *args):
            raise RuntimeError("decode failed")

    pipeline, _, _ = make_pipeline(FailingDecode(), "inline")
    free = len(pipeline.inline.free_slots)
    with pytest.raises(RuntimeError, match="decode failed"):
        pipeline.open("a", "key-a", "addr", warmup_codes=random_codes(3, seed=12))
    assert len(pipeline.inline.free_slots) == free and "a" not in pipeline.streams


def test_mode_switch_only_when_idle(program):
    pipeline, sender, _ = make_pipeline(program, "inline")
    assert pipeline.codec_modes() == {"modes": ["inline", "lanes"], "current": "inline"}
    pipeline.open("a", "key-a", "addr")
    with pytest.raises(CodecModeBusy):
        pipeline.set_codec_mode("lanes")
    with pytest.raises(ValueError):
        pipeline.set_codec_mode("time_sharing")
    pipeline.close("a")
    pipeline.set_codec_mode("lanes")
    assert pipeline.codec_mode == "lanes" and pipeline.lanes is not None
    codes = random_codes(FIRST + 1, seed=11)
    pipeline.open("b", "key-b", "addr")
    pipeline.push(codes, ["b"] * len(codes))
    pipeline.close("b")
    check_stream(sender, "key-b", full_decode(program, codes), 2)
    pipeline.set_codec_mode("inline")
    assert pipeline.codec_mode == "inline"


def test_worker_rpc_reports_switches_and_refuses(program):
    pipeline, _, _ = make_pipeline(program, "inline")

    class Runner:  # what the worker's model_runner looks like to the rpc: V1 runners carry `speech`
        class speech:
            pass

    Runner.speech.pipeline = pipeline
    assert codec_mode_call(Runner, None) == {"status": 200, "modes": ["inline", "lanes"], "current": "inline"}
    assert codec_mode_call(Runner, "lanes")["current"] == "lanes"
    assert codec_mode_call(Runner, "bogus")["status"] == 400
    pipeline.open("a", "key-a", "addr")
    reply = codec_mode_call(Runner, "inline")
    assert reply["status"] == 409 and reply["current"] == "lanes"
    assert codec_mode_call(object(), "lanes")["status"] == 503


def test_default_codec_mode_is_inline_on_cpu_and_auto_is_no_switch_target(program):
    config = VoxServeConfig.from_dict({"max_codec_slots": 4})
    assert config.codec_mode.value == "auto" and config.codec_dtype == "auto"
    pipeline = AudioPipeline(program, config, FakeSender(), torch.device("cpu"), clock=FrozenClock())
    assert pipeline.codec_modes() == {"modes": ["inline", "lanes"], "current": "inline"}  # lanes on a GPU
    with pytest.raises(ValueError, match="unknown codec mode"):
        pipeline.set_codec_mode("auto")


def test_a_first_chunk_and_an_overdue_later_chunk_of_another_length_run_in_separate_batches(program):
    """Both are urgent at once; one batch runs one (bucket, frames) executable, so each gets its own (found on the
    H200 at 64 req/s, where such a mixed batch failed every request in it)."""
    pipeline, sender, launches = make_pipeline(program, "lanes")
    clock = pipeline.lanes.clock
    a, b = random_codes(FIRST + LATER, seed=1), random_codes(FIRST, seed=2)
    pipeline.open("a", "key-a", "addr")
    pipeline.push(a[:FIRST], ["a"] * FIRST)  # a's first chunk: urgent lane
    pipeline.push(a[FIRST:], ["a"] * LATER)  # a's second chunk waits for a background batch
    pipeline.open("b", "key-b", "addr")
    clock.now += 30.0  # a's second chunk is now overdue: urgent, like b's first chunk (another length)
    pipeline.push(b, ["b"] * FIRST)
    pipeline.close("a")
    pipeline.close("b")
    pipeline.lanes.drain()
    check_stream(sender, "key-a", full_decode(program, a), 2)
    check_stream(sender, "key-b", full_decode(program, b), 1)
    urgent = [chunks for kind, chunks, _ in launches if kind is LaneKind.URGENT]
    assert [("a", 0)] in urgent and any(("a", 1) in c for c in urgent) and any(("b", 0) in c for c in urgent)


def test_a_short_last_chunk_joins_a_batch_of_longer_chunks_padded(program):
    """b's whole audio is one 2-frame last chunk; a's first chunk has 4 frames; both wait for the urgent lane. They
    go in one batch at 4 frames, b's padded (its padding follows its audio), and each stream is its full decode."""
    pipeline, sender, launches = make_pipeline(program, "lanes")
    gate = hold_lane_batches(pipeline)
    x, a, b = random_codes(FIRST, seed=30), random_codes(FIRST + LATER, seed=31), random_codes(2, seed=32)
    for rid in "xab":
        pipeline.open(rid, f"key-{rid}", "addr")
    pipeline.push(x, ["x"] * FIRST)  # x's first chunk holds the urgent lane
    pipeline.push(b, ["b"] * 2)
    pipeline.close("b")  # b's only chunk: 2 frames, its last
    pipeline.push(a[:FIRST], ["a"] * FIRST)
    assert [chunks for kind, chunks, _ in launches if kind is LaneKind.URGENT] == [[("x", 0)]]
    gate["open"] = True
    pipeline.push(a[FIRST:], ["a"] * LATER)  # harvests x's chunk, then launches the two waiting first chunks
    assert sorted(launches[1][1]) == [("a", 0), ("b", 0)] and launches[1][0] is LaneKind.URGENT
    for rid in "xa":
        pipeline.close(rid)
    check_stream(sender, "key-a", full_decode(program, a), 2)
    check_stream(sender, "key-b", full_decode(program, b), 1)
    check_stream(sender, "key-x", full_decode(program, x), 1)


@pytest.mark.gpu
def test_inline_mode_on_gpu_decodes_through_codec_graphs_as_eagerly(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    make_random_speech_tokenizer(tmp_path, "tiny", 0, torch.float32)
    program = Qwen3CodecProgram(load_codec_decoder(tmp_path, torch.float32).cuda())
    audio = {}
    for use_graphs in (True, False):
        config = VoxServeConfig.from_tree({"codec_mode": "inline", "first_chunk_frames": FIRST,
                                           "chunk_frames": LATER, "max_codec_slots": 8,
                                           "lanes": {"use_graphs": use_graphs}})
        sender = FakeSender()
        pipeline = AudioPipeline(program, config, sender, torch.device("cuda"), clock=FrozenClock())
        assert (pipeline.inline.graphs is not None) == use_graphs
        codes = run_interleaved(pipeline, LENGTHS, STARTS)
        for r, n in LENGTHS.items():
            got = sender.of(f"key-{r}")
            assert [m[0] for m in got] == ["audio"] * num_chunks(n) + ["end"]
            audio[use_graphs, r] = np.concatenate([m[3] for m in got[:-1]])
    for r in LENGTHS:
        np.testing.assert_allclose(audio[True, r], audio[False, r], atol=1e-5)
        # a full decode differs by TF32 convolution rounding on GPU, not by more
        np.testing.assert_allclose(audio[True, r], full_decode(program, codes[r].cuda()), atol=5e-3)


@pytest.mark.parametrize("mode", ["inline", "lanes"])
def test_each_first_audio_records_its_path_from_prefill_to_cut_to_audio(program, mode):
    """Times taken from the pipeline's clock: opened at 0, first chunk cut after FIRST frames at 1 s a frame; a
    request shorter than a first chunk is cut when it closes."""
    pipeline, sender, _ = make_pipeline(program, mode)
    clock = pipeline.clock
    start = clock.now
    pipeline.open("a", "key-a", "addr")
    pipeline.open("short", "key-short", "addr")
    codes = random_codes(FIRST, seed=1)
    for i in range(FIRST):
        clock.now = start + i + 1
        pipeline.push(codes[i : i + 1], ["a"])
    assert [m[0] for m in sender.of("key-a")] == ["audio"]  # the lanes are pumped in push (synchronous on CPU)
    pumped = pipeline.lanes is not None and sum(pipeline.lanes.pump_seconds.values()) > 0
    assert pumped == (mode == "lanes")  # the step log's host time of that pump
    clock.now = start + 10
    pipeline.push(codes[:1], ["short"])
    pipeline.close("short")
    pipeline.close("a")
    # the clock stood still while decoding; "short" waited out the FIRST steps that decoded only "a"
    assert pipeline.first_audio_paths == [(FIRST, 0.0, FIRST), (10.0, 0.0, FIRST + 1)]
