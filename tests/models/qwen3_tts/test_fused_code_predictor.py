"""The served code-predictor frame (`FusedCodePredictor.frame`) against the reference `CodePredictor`, on CPU."""
from __future__ import annotations

import pytest
import torch

from vllm_voxserve.models.qwen3_tts.checkpoint import official_config, randomize_
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.fused_code_predictor import CANDIDATES, FusedCodePredictor
from vllm_voxserve.models.qwen3_tts.talker import Talker
from vllm_voxserve.models.seeded_noise import uniform_noise, uniform_noise_at


def _talker(project: bool) -> Talker:
    raw = official_config("tiny", "custom_voice")
    if not project:  # the 0.6B layout: the code predictor is as wide as the talker, no projection
        raw["talker_config"]["code_predictor_config"]["hidden_size"] = raw["talker_config"]["hidden_size"]
    config = Qwen3TTSConfig.from_dict(raw)
    model = Talker(config.talker_config)
    randomize_(model, torch.Generator().manual_seed(3))
    return model.eval()


@pytest.fixture(scope="module", params=[True, False], ids=["projected", "same-width"])
def talker(request) -> Talker:
    return _talker(request.param)


def _rows(talker, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, talker.config.hidden_size, generator=g)
    c0 = torch.randint(0, 2048, (batch,), generator=g)
    return hidden, c0, torch.randint(0, 2**31, (batch,), generator=g), torch.randint(0, 500, (batch,), generator=g)


def test_layouts_differ(talker):
    cp = talker.code_predictor
    assert FusedCodePredictor(cp).project_hidden == (cp.config.hidden_size != talker.config.hidden_size)


@torch.no_grad()
def test_greedy_frame_equals_reference(talker):
    cp = talker.code_predictor
    hidden, c0, seed, frame = _rows(talker, 6)
    zeros = torch.zeros(6)
    fused = FusedCodePredictor(cp).frame(hidden, c0, zeros, torch.full((6,), 50), torch.ones(6), seed, frame)
    assert torch.equal(fused, cp.predict_frame(hidden, c0))


@torch.no_grad()
def test_sampled_frame_equals_reference_with_the_same_noise(talker):
    cp = talker.code_predictor
    hidden, c0, seed, frame = _rows(talker, 8, seed=1)
    temperature = torch.tensor([0.9, 0.9, 1.3, 0.5, 0.0, 0.9, 2.0, 0.9])
    top_k = torch.tensor([50, 1, 5, CANDIDATES, 50, 20, 64, 50])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.9, 1.0, 0.3, 0.95, 1.0])
    fused = FusedCodePredictor(cp).frame(hidden, c0, temperature, top_k, top_p, seed, frame)
    noise = uniform_noise(seed, frame, cp.num_groups - 1, cp.config.vocab_size)
    reference = cp.predict_frame(hidden, c0, temperature, top_k, top_p, uniform=noise)
    assert torch.equal(fused, reference)
    assert not torch.equal(fused, cp.predict_frame(hidden, c0))  # the sampled rows did sample


@torch.no_grad()
def test_rows_do_not_depend_on_their_batch(talker):
    fused = FusedCodePredictor(talker.code_predictor)
    hidden, c0, seed, frame = _rows(talker, 5, seed=2)
    params = (torch.full((5,), 0.9), torch.full((5,), 50), torch.ones(5))
    batched = fused.frame(hidden, c0, *params, seed, frame)
    for i in range(5):
        one = fused.frame(hidden[i:i + 1], c0[i:i + 1], *(p[i:i + 1] for p in params), seed[i:i + 1],
                          frame[i:i + 1])
        assert torch.equal(one[0], batched[i])


def test_noise_at_indices_equals_the_full_tensor():
    seed, step = torch.tensor([3, 99, 2**31 - 1]), torch.tensor([0, 17, 400])
    full = uniform_noise(seed, step, 15, 2048)
    index = torch.randint(0, 2048, (3, 64), generator=torch.Generator().manual_seed(0))
    for draw in (0, 7, 14):
        assert torch.equal(uniform_noise_at(seed, step, draw, index), full[:, draw].gather(1, index))


def _eager_and_captured(kernels: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16-row frame of an fp32 talker: the eager tensor code's codes, and those of the compiled frame (with or
    without our kernels) captured in a CUDA graph and replayed."""
    talker = _talker(True).cuda()
    plain, fused = FusedCodePredictor(talker.code_predictor), FusedCodePredictor(talker.code_predictor, kernels)
    hidden, c0, seed_t, frame = (t.cuda() for t in _rows(talker, 16, seed=seed))
    args = (hidden, c0, torch.full((16,), 0.9, device="cuda"), torch.full((16,), 50, device="cuda"),
            torch.ones(16, device="cuda"), seed_t, frame)
    eager = plain.frame(*args)
    fused.compile()
    fused.frame(*args)  # compile + warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused.frame(*args)
    graph.replay()
    torch.cuda.synchronize()
    return eager, out


@pytest.mark.gpu
@torch.no_grad()
def test_compiled_frame_in_a_cuda_graph_equals_eager():
    eager, captured = _eager_and_captured(kernels=False, seed=4)
    assert torch.equal(captured, eager)


@pytest.mark.gpu
@torch.no_grad()
def test_frame_with_our_kernels_in_a_cuda_graph_matches_the_tensor_code():
    """fp32: our Triton kernels differ from the tensor code only in rounding (and tie order), so the codes agree."""
    eager, captured = _eager_and_captured(kernels=True, seed=5)
    assert (captured == eager).float().mean().item() > 0.9


@pytest.mark.parametrize("kernels", [False, True])
@torch.no_grad()
def test_compiled_frame_equals_eager_for_any_batch_without_recompiling(kernels):
    """torch.compile (CPU inductor here) of the two repeated pieces: one graph per piece and pass shape serves every
    batch size; the codes equal the eager frame's. With our operators (their tensor code on CPU), too."""
    import torch._dynamo

    talker = _talker(True)
    fused = FusedCodePredictor(talker.code_predictor, kernels)
    inputs = {b: _rows(talker, b, seed=b) for b in (3, 5, 2)}
    params = {b: (torch.full((b,), 0.9), torch.full((b,), 50), torch.ones(b)) for b in inputs}
    eager = {b: fused.frame(h, c0, *params[b], seed, frame) for b, (h, c0, seed, frame) in inputs.items()}
    torch._dynamo.reset()
    fused.compile()
    counts = []
    for b, (h, c0, seed, frame) in inputs.items():
        assert torch.equal(fused.frame(h, c0, *params[b], seed, frame), eager[b])
        counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert counts[0] > 0 and counts[1] == counts[2] == counts[0]  # batches 5 and 2 reuse batch 3's graphs
