"""Code predictor serving API (`predict_frame`, `frame_embedding`) and the sampling rules, on CPU (one GPU test)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from vllm_voxserve.models.qwen3_tts.checkpoint import official_config, randomize_
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.prompt import PromptTables, TalkerGenerationRules
from vllm_voxserve.models.qwen3_tts.sampling import apply_talker_rules, full, sample, seen_mask, suppression_mask, warp
from vllm_voxserve.models.qwen3_tts.talker import Talker


@pytest.fixture(scope="module")
def talker() -> Talker:
    config = Qwen3TTSConfig.from_dict(official_config("tiny", "custom_voice"))
    model = Talker(config.talker_config)
    randomize_(model, torch.Generator().manual_seed(3))
    return model.eval()


def _inputs(talker, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, talker.config.hidden_size, generator=g)
    c0 = torch.randint(0, 2048, (batch,), generator=g)
    return hidden, c0


@contextlib.contextmanager
def no_host_sync():
    """Fail on any tensor -> Python value conversion (what would sync the host and break a CUDA graph)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(*_args, **_kwargs):
        raise AssertionError("host sync inside a graph-capturable path")

    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


@torch.no_grad()
def test_predict_frame_batched_equals_per_row_greedy(talker):
    cp = talker.code_predictor
    hidden, c0 = _inputs(talker, 5)
    with no_host_sync():
        batched = cp.predict_frame(hidden, c0)
    rows = torch.cat([cp.predict_frame(hidden[i:i + 1], c0[i:i + 1]) for i in range(5)])
    assert batched.shape == (5, 15) and batched.dtype == torch.long
    assert torch.equal(batched, rows)
    assert len(set(batched[0].tolist())) > 3  # not a degenerate repeated code


@torch.no_grad()
def test_incremental_path_equals_one_causal_pass(talker):
    cp = talker.code_predictor
    hidden, c0 = _inputs(talker, 3, seed=1)
    codes, logits = cp.run_frame(hidden, c0)
    one_pass = cp.teacher_forced_logits(hidden, torch.cat([c0[:, None], codes], dim=1))
    torch.testing.assert_close(logits, one_pass, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_predict_frame_sampling_per_row_and_seeded(talker):
    cp = talker.code_predictor
    hidden, c0 = _inputs(talker, 4, seed=2)
    temperature = torch.tensor([0.0, 0.9, 0.9, 1.3])
    top_k = torch.tensor([0, 1, 50, 0])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.95])
    with no_host_sync():
        a = cp.predict_frame(hidden, c0, temperature, top_k, top_p, torch.Generator().manual_seed(5))
    b = cp.predict_frame(hidden, c0, temperature, top_k, top_p, torch.Generator().manual_seed(5))
    greedy = cp.predict_frame(hidden, c0)
    assert torch.equal(a, b)
    assert torch.equal(a[0], greedy[0])  # temperature 0: greedy row
    assert torch.equal(a[1], greedy[1])  # top-k 1: only the argmax survives
    c = cp.predict_frame(hidden, c0, temperature, top_k, top_p, torch.Generator().manual_seed(6))
    assert not torch.equal(a[2:], c[2:])  # sampled rows depend on the seed


@torch.no_grad()
def test_frame_embedding_is_the_cat_sum_of_the_16_tables(talker):
    codes = torch.randint(0, 2048, (3, 16), generator=torch.Generator().manual_seed(4))
    expected = talker.model.codec_embedding(codes[:, 0])
    for q in range(1, 16):
        expected = expected + talker.code_predictor.model.codec_embedding[q - 1](codes[:, q])
    torch.testing.assert_close(talker.frame_embedding(codes), expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(talker.code_predictor.frame_embedding(codes), talker.frame_embedding(codes))


def test_talker_rules_penalty_min_tokens_and_suppression():
    rules = TalkerGenerationRules.from_tables(PromptTables.from_config(official_config("tiny", "custom_voice")))
    vocab = 3072
    logits = torch.linspace(-3, 3, vocab).repeat(2, 1)
    suppressed = suppression_mask(rules, vocab)
    seen = seen_mask([[5, 3000], []], vocab)
    out = apply_talker_rules(logits, rules, torch.tensor([1, 2]), suppressed, seen, 1.05)
    assert out[0, 5] == logits[0, 5] * 1.05  # negative score: multiplied
    assert out[1, 5] == logits[1, 5]  # not generated in row 1
    assert torch.isinf(out[0, 2150]) and out[1, 2150] == logits[1, 2150]  # EOS masked only before 2 tokens
    assert torch.isinf(out[:, 2048]).all() and torch.isinf(out[:, 3071]).all()
    assert torch.isfinite(out[:, :2048]).all()


def test_warp_matches_the_hf_rules():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, -1.0]])
    top2 = warp(logits, full(1, 1.0), full(1, 2), full(1, 1.0))
    assert torch.isfinite(top2).tolist() == [[False, True, True, True, False]]  # ties with the k-th are kept
    # top-p 0.5 keeps the smallest set whose mass reaches it (HF removes cumulative mass <= 1 - p, ascending)
    probs = torch.tensor([[0.05, 0.6, 0.2, 0.15]]).log()
    kept = torch.isfinite(warp(probs, full(1, 1.0), full(1, 0), full(1, 0.5)))
    assert kept.tolist() == [[False, True, False, False]]
    halved = warp(logits, full(1, 2.0), full(1, 0), full(1, 1.0))
    torch.testing.assert_close(halved, logits / 2)
    assert torch.equal(sample(logits), torch.tensor([1]))


@pytest.mark.gpu
@torch.no_grad()
def test_predict_frame_captures_in_one_cuda_graph(talker):
    cp_talker = Talker(talker.config).cuda().eval()
    cp_talker.load_state_dict(talker.state_dict())
    cp = cp_talker.code_predictor
    hidden, c0 = (t.cuda() for t in _inputs(talker, 4, seed=9))
    temperature, top_k, top_p = full(4, 0.9, "cuda"), full(4, 50, "cuda"), full(4, 1.0, "cuda")
    eager = cp.predict_frame(hidden, c0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cp.predict_frame(hidden, c0, temperature, top_k, top_p)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph, sampled_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        greedy_out = cp.predict_frame(hidden, c0)
    with torch.cuda.graph(sampled_graph):
        sampled_out = cp.predict_frame(hidden, c0, temperature, top_k, top_p)
    graph.replay()
    sampled_graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(greedy_out, eager)
    assert ((sampled_out >= 0) & (sampled_out < 2048)).all()


@pytest.mark.gpu
@torch.no_grad()
def test_talker_rules_and_sampling_capture_in_a_cuda_graph():
    rules = TalkerGenerationRules.from_tables(PromptTables.from_config(official_config("tiny", "custom_voice")))
    suppressed = suppression_mask(rules, 3072, "cuda")
    seen = seen_mask([[1, 2], [3]], 3072, "cuda")
    logits = torch.randn(2, 3072, device="cuda")
    num_generated = torch.tensor([0, 5], device="cuda")
    params = (full(2, 0.9, "cuda"), full(2, 50, "cuda"), full(2, 0.8, "cuda"))

    def step():
        processed = apply_talker_rules(logits, rules, num_generated, suppressed, seen, 1.05)
        return processed, sample(processed, *params)

    eager_logits, _ = step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_logits, ids = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(graph_logits, eager_logits)
    assert torch.isfinite(graph_logits.gather(1, ids[:, None])).all()
