import pytest
import torch

from vllm_voxserve.models.qwen3_tts.job import CodePredictorSampling, SpeechJob
from vllm_voxserve.models.qwen3_tts.prompt import SpeechPrompt
from vllm_voxserve.models.qwen3_tts.step_buffers import ServedRequest, StepBuffers
from vllm_voxserve.models.seeded_noise import _base
from vllm_voxserve.models.step_layout import StepLayout

H = 4
V = 8  # codebook-0 vocabulary of the fake buffers


def request(req_id: str, slot: int, prompt_len: int, trailing=(), fixed=False, seed=0) -> ServedRequest:
    prefill = torch.arange(prompt_len * H, dtype=torch.float32).reshape(prompt_len, H) + 1000 * slot
    return ServedRequest(req_id, slot, prompt_len, prefill, tuple(trailing), 151671, fixed, 0.9, 50, 1.0, seed)


def test_fill_mixes_prefill_chunks_decode_rows_and_vllm_dummy_rows():
    buffers = StepBuffers(max_tokens=16, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    requests = {"a": request("a", 2, 5, trailing=(11, 12), seed=9), "b": request("b", 0, 3, fixed=True)}
    # a decodes its 2nd frame (position 6 = prompt 5 + step 1); b prefills positions 1..2; a vLLM dummy row last
    rows = buffers.fill(StepLayout(("a", "b", "dummy"), (1, 2, 1), (6, 1, 0)), requests)
    assert [(r.row, r.req_id, r.frame_index) for r in rows] == [(0, "a", 1)]
    assert buffers.is_decode[:4].tolist() == [True, False, False, False]
    assert buffers.text_ids[0].item() == 12  # trailing text of decode step 1
    assert buffers.read_slot[:3].tolist() == [2, 0, 0]
    # each request's last row stashes its hidden state in its slot; others write the scratch slot
    assert buffers.write_slot[:4].tolist() == [2, 4, 0, 4]
    torch.testing.assert_close(buffers.prefill_embeds[1:3], requests["b"].prefill_embeds[1:3])
    assert buffers.suppress_eos[:3].tolist() == [False, True, False]
    assert buffers.seed[0].item() == 9 and buffers.frame_index[0].item() == 1
    assert buffers.write_slot[4:].eq(4).all() and not buffers.is_decode[4:].any()
    # the code predictor runs on the decode rows only, padded by repeating the first one
    assert buffers.decode_row_index.tolist() == [0, 0, 0, 0]
    requests["c"] = request("c", 3, 2)
    buffers.fill(StepLayout(("b", "c", "a"), (2, 1, 1), (1, 2, 7)), requests)
    assert buffers.decode_row_index.tolist() == [2, 3, 2, 2]
    assert 0 <= buffers.last_wait_s < 1 and 0 < buffers.last_copies_s < 1  # the step log's parts of prepare


def test_decode_past_the_trailing_text_adds_tts_pad_and_unknown_history_is_reported():
    buffers = StepBuffers(max_tokens=8, max_slots=2, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    requests = {"a": request("a", 1, 2, trailing=(11,))}
    buffers.fill(StepLayout(("a",), (1,), (5,)), requests)
    assert buffers.text_ids[0].item() == 151671
    buffers.fill(StepLayout(("a",), (4,), (0,)), requests)  # recomputed past the prompt, but no frame was recorded
    assert requests["a"].failed and "cannot recompute" in requests["a"].failed


def replayed(req, k):
    return torch.full((H,), 100.0 * (k + 1))


def test_a_preempted_request_is_recomputed_from_its_frames_and_keeps_its_stash_until_it_decodes():
    buffers = StepBuffers(max_tokens=8, max_slots=2, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    a = request("a", 1, 3)
    requests = {"a": a}
    buffers.fill(StepLayout(("a",), (3,), (0,)), requests, replayed)  # the prefill
    assert a.prefill_done and not a.resuming and buffers.write_slot[2].item() == 1
    a.frames += [torch.zeros(16), torch.ones(16)]  # frames 0 and 1 finished; its token for frame 2 is pending
    # vLLM recomputes it in two chunks: positions 0..3, then 4..5 (the last is the pending token, frame 2)
    rows = buffers.fill(StepLayout(("a",), (4,), (0,)), requests, replayed)
    assert rows == [] and a.resuming and not a.failed
    torch.testing.assert_close(buffers.prefill_embeds[:3], a.prefill_embeds)
    torch.testing.assert_close(buffers.prefill_embeds[3], replayed(a, 0))
    assert buffers.write_slot[:4].tolist() == [2, 2, 2, 2]  # the stash from before the preemption stays
    assert not buffers.is_decode[:4].any()
    rows = buffers.fill(StepLayout(("a",), (2,), (4,)), requests, replayed)
    assert [(r.row, r.frame_index) for r in rows] == [(1, 2)] and not a.resuming
    torch.testing.assert_close(buffers.prefill_embeds[0], replayed(a, 1))
    assert buffers.is_decode[:2].tolist() == [False, True] and buffers.write_slot[:2].tolist() == [2, 1]
    a.frames.append(torch.full((16,), 2))
    rows = buffers.fill(StepLayout(("a",), (1,), (6,)), requests, replayed)  # decoding as usual again
    assert [(r.row, r.frame_index) for r in rows] == [(0, 3)] and buffers.write_slot[0].item() == 1


def test_job_survives_the_extra_args_round_trip():
    job = SpeechJob("key", "ipc:///tmp/x", SpeechPrompt(text_ids=(1, 2), speaker="ryan", instruct_ids=(5,)),
                    ref_audio=b"\x00" * 8, fixed_length=True, seed=3,
                    code_predictor=CodePredictorSampling(0.5, 10, 0.9), ttfa_slo_ms=150.0)
    assert SpeechJob.from_extra_args(job.to_extra_args()) == job


BUFFERS = ("text_ids", "is_decode", "read_slot", "write_slot", "prefill_embeds", "cp_temperature", "cp_top_k",
           "cp_top_p", "seed", "frame_index", "suppress_eos", "decode_row_index")


@pytest.mark.gpu
def test_gpu_fill_through_alternating_pinned_staging_equals_the_cpu_fill():
    """On GPU the host copy of each step is page-locked and two alternate (the copies are only queued): filling
    step after step without waiting for the device must give each step's values, as the synchronous CPU fill does."""
    layouts = [StepLayout(("a", "b", "dummy"), (1, 2, 1), (6, 1, 0)), StepLayout(("b", "c", "a"), (2, 1, 1), (1, 2, 7)),
               StepLayout(("c", "a"), (1, 1), (3, 8)), StepLayout(("a",), (1,), (9,))]

    def requests(device):
        made = {"a": request("a", 2, 5, trailing=(11, 12), seed=9), "b": request("b", 0, 3, fixed=True),
                "c": request("c", 3, 2)}
        for r in made.values():
            r.prefill_embeds = r.prefill_embeds.to(device)
        return made

    cpu = StepBuffers(max_tokens=16, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    gpu = StepBuffers(max_tokens=16, max_slots=4, hidden_size=H, dtype=torch.float32, device="cuda", vocab_size=V)
    cpu_requests, gpu_requests = requests("cpu"), requests("cuda")
    snapshots = []
    torch.cuda._sleep(50_000_000)  # keep the stream busy so that the fills' copies are still queued behind it
    for layout in layouts:
        cpu.fill(layout, cpu_requests)
        gpu.fill(layout, gpu_requests)
        expected = {name: getattr(cpu, name).clone() for name in BUFFERS}
        snapshots.append((expected, {name: getattr(gpu, name).clone() for name in BUFFERS}))  # in stream order
    torch.cuda.synchronize()
    for expected, got in snapshots:
        for name in BUFFERS:
            assert torch.equal(got[name].cpu(), expected[name]), name


def test_a_seed_past_the_signed_64_bit_range_fails_its_own_request_not_the_step():
    for seed in (2**63, 2**64 - 1, -(2**63) - 1):
        with pytest.raises(ValueError, match="seed"):
            request("a", 0, 3, seed=seed)
    for seed in (2**63 - 1, -(2**63)):  # the range's ends are fine, and fill writes them
        buffers = StepBuffers(max_tokens=4, max_slots=2, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
        buffers.fill(StepLayout(("a",), (1,), (3,)), {"a": request("a", 0, 3, seed=seed)})
        assert buffers.seed[0].item() == seed


def test_a_request_whose_rows_raise_fails_alone_and_its_rows_keep_nothing():
    def layout():
        return StepLayout(("a", "bad", "c"), (1, 1, 2), (6, 4, 0))

    def fresh():
        return {"a": request("a", 2, 5, trailing=(11, 12), seed=9), "bad": request("bad", 1, 3, seed=7),
                "c": request("c", 0, 3)}

    def raise_for_bad(req, frames):
        if req.req_id == "bad":
            raise OverflowError("boom")

    clean = StepBuffers(max_tokens=8, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    without_bad = fresh()
    clean_rows = clean.fill(layout(), without_bad)
    faulted = StepBuffers(max_tokens=8, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    requests = fresh()
    rows = faulted.fill(layout(), requests, row_check=raise_for_bad)
    assert "OverflowError: boom" in requests["bad"].failed and not requests["a"].failed and not requests["c"].failed
    assert [r.req_id for r in rows] == ["a"] == [r.req_id for r in clean_rows if r.req_id != "bad"]
    # its row writes the scratch slot, is no decode row; the others' rows are as without the fault
    assert faulted.write_slot[1].item() == faulted.scratch_slot and not faulted.is_decode[1]
    for name in BUFFERS:
        if name != "decode_row_index":
            for row in (0, 2, 3):
                torch.testing.assert_close(getattr(faulted, name)[row], getattr(clean, name)[row])
    # later steps skip it without asking again
    assert [r.req_id for r in faulted.fill(StepLayout(("bad", "a"), (1, 1), (5, 7)), requests, row_check=None)] \
        == ["a"]


def test_fill_writes_codebook0_sampling_per_request_row():
    buffers = StepBuffers(max_tokens=8, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    a = ServedRequest("a", 2, 3, torch.zeros(3, H), (), 0, False, 0.9, 50, 1.0, -(2**63),
                      talker_sampling=(0.7, 40, 0.8, 1.1))
    b = ServedRequest("b", 1, 2, torch.zeros(2, H), (), 0, False, 0.9, 50, 1.0, 2**63 - 1,
                      talker_sampling=(0.0, 0, 1.0, 1.0))
    b.prefill_done, b.frames = True, [None] * 4
    # a prefills all 3 prompt rows; b decodes at position 2 + 4 (it has generated 5 tokens)
    buffers.fill(StepLayout(["a", "b"], [3, 1], [0, 6]), {"a": a, "b": b})
    assert buffers.sample_slot[:2].tolist() == [2, 1]
    assert buffers.sample_row[:2].tolist() == [2, 3] and buffers.sample_rows == 2  # each request's last row
    # the (seed, draw) half of each row's counter noise, hashed on the host as the device would
    seeds, steps = torch.tensor([-(2**63), 2**63 - 1]), torch.tensor([0, 5])
    assert torch.equal(buffers.sample_noise_base[:2], _base(seeds, steps))
    assert buffers.sample_step[:2].tolist() == [0, 5]
    assert buffers.sample_top_k[:2].tolist() == [40, 0]
    assert buffers.sample_temperature[:2].tolist() == pytest.approx([0.7, 0.0])
    assert buffers.sample_top_p[:2].tolist() == pytest.approx([0.8, 1.0])
    assert buffers.sample_penalty[:2].tolist() == pytest.approx([1.1, 1.0])


def test_a_text_streams_decode_rows_read_its_track_and_one_whose_token_is_missing_fails_alone():
    from vllm_voxserve.models.qwen3_tts.text_track import TextTrack

    buffers = StepBuffers(max_tokens=8, max_slots=4, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    track = TextTrack(151673, 151671)
    track.merge(0, (20, 21, 22))
    streamed = request("t", 1, 3)
    streamed.text_track = track
    requests = {"t": streamed, "a": request("a", 2, 5, trailing=(11, 12))}
    rows = buffers.fill(StepLayout(("t", "a"), (1, 1), (4, 6)), requests)  # t's step 1 reads token 2
    assert [r.req_id for r in rows] == ["t", "a"] and buffers.text_ids[:2].tolist() == [22, 12]
    rows = buffers.fill(StepLayout(("t", "a"), (1, 1), (5, 7)), requests)  # step 2: token 3 has not arrived
    assert "decode step 2 needs text token 3" in streamed.failed and not requests["a"].failed
    assert [r.req_id for r in rows] == ["a"]


def test_a_slot_taken_by_a_new_request_gets_that_requests_constants():
    """fill keeps each slot's request constants between steps: a new request in a finished one's slot (even with its
    id) must bring its own seed, sampling and text pad, and a failed request's rows must not read them."""
    buffers = StepBuffers(max_tokens=8, max_slots=2, hidden_size=H, dtype=torch.float32, device="cpu", vocab_size=V)
    first = ServedRequest("a", 1, 2, torch.zeros(2, H), (), 7, True, 0.5, 10, 0.9, 3,
                          talker_sampling=(0.7, 40, 0.8, 1.1))
    buffers.fill(StepLayout(("a",), (1,), (3,)), {"a": first})
    assert (buffers.seed[0].item(), buffers.cp_top_k[0].item(), buffers.text_ids[0].item()) == (3, 10, 7)
    again = ServedRequest("a", 1, 2, torch.zeros(2, H), (), 9, False, 0.0, 5, 1.0, 4,
                          talker_sampling=(0.0, 0, 1.0, 1.0))
    buffers.fill(StepLayout(("a",), (1,), (3,)), {"a": again})
    assert (buffers.seed[0].item(), buffers.cp_top_k[0].item(), buffers.text_ids[0].item()) == (4, 5, 9)
    assert buffers.cp_temperature[0].item() == 0.0 and buffers.cp_top_p[0].item() == 1.0
    assert buffers.sample_temperature[0].item() == 0.0 and not buffers.suppress_eos[0]
    assert torch.equal(buffers.sample_noise_base[:1], _base(torch.tensor([4]), torch.tensor([2])))
    again.failed = "gone"
    buffers.fill(StepLayout(("a",), (1,), (4,)), {"a": again})
    assert buffers.sample_slot[0].item() == 2 and buffers.text_ids[0].item() == 0  # the scratch slot's placeholder
