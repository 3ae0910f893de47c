"""Codebook 0's draw (`Codebook0Draw`, at the end of the served forward): the same ids as the reference composition
(talker rules, `sample` with the counter noise of `uniform_noise_at`), with ops that never depend on the step's values
(so it runs inside the step's CUDA graph); `compute_logits` hands vLLM the forward's draw."""

import types
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_voxserve.models.qwen3_tts.sampling import apply_talker_rules, sample
from vllm_voxserve.models.qwen3_tts.step_buffers import ServedRequest, StepBuffers
from vllm_voxserve.models.qwen3_tts.codebook0 import CODEBOOK0_DRAW, Codebook0Draw
from vllm_voxserve.models.qwen3_tts.vllm_model import Qwen3TTSForVllm
from vllm_voxserve.models.seeded_noise import noise_base_on_host, noise_part, seed_half_on_host, unit, uniform_noise_at
from vllm_voxserve.models.step_layout import StepLayout

H, V, EOS = 4, 64, 60
RULES = types.SimpleNamespace(min_new_tokens=2, eos_id=EOS, suppressed_ids=frozenset(range(61, 64)))
SEEDS = (-(2**63), 2**63 - 1, 0, 7, -12345, 2**40 + 3)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def drawer() -> Codebook0Draw:
    suppressed = torch.zeros(V, dtype=torch.bool)
    suppressed[list(RULES.suppressed_ids)] = True
    return Codebook0Draw(RULES, suppressed)


def step(sampling: list[tuple[float, int, float, float]], generated: list[int]):
    """A decode step of one row per request (request i: seed SEEDS[i], `generated` tokens so far), buffers filled."""
    buffers = StepBuffers(max_tokens=16, max_slots=8, hidden_size=H, dtype=torch.float32, device="cpu",
                          vocab_size=V)
    requests = {}
    for i, (settings, made) in enumerate(zip(sampling, generated, strict=True)):
        req = ServedRequest(f"r{i}", i, 3, torch.zeros(3, H), (), 0, False, 0.9, 50, 1.0, SEEDS[i],
                            talker_sampling=settings)
        req.prefill_done, req.frames = True, [None] * max(made - 1, 0)
        requests[req.req_id] = req
    ids = tuple(requests)
    buffers.fill(StepLayout(ids, (1,) * len(ids), tuple(3 + max(made - 1, 0) for made in generated)), requests)
    gen = torch.Generator().manual_seed(len(ids))
    buffers.seen[: len(ids)] = torch.rand(len(ids), V, generator=gen) < 0.2
    return buffers, torch.randn(len(ids), V, generator=gen) * 3


def reference_ids(buffers: StepBuffers, logits: torch.Tensor, seeds) -> torch.Tensor:
    """The draw as composed before: the talker rules, then `sample` with `uniform_noise_at` over every id."""
    rows = logits.shape[0]
    mask = torch.zeros(rows, V, dtype=torch.bool)
    mask[:, list(RULES.suppressed_ids)] = True
    mask[:, EOS] = buffers.suppress_eos[:rows]
    steps = buffers.sample_step[:rows]
    processed = apply_talker_rules(logits, RULES, steps, mask, buffers.seen[buffers.sample_slot[:rows]],
                                   buffers.sample_penalty[:rows])
    noise = uniform_noise_at(torch.tensor(seeds, dtype=torch.long), steps, CODEBOOK0_DRAW,
                             torch.arange(V).expand(rows, -1))
    return sample(processed, buffers.sample_temperature[:rows], buffers.sample_top_k[:rows],
                  buffers.sample_top_p[:rows], uniform=noise)


MIXED = [(0.9, 50, 1.0, 1.05), (0.7, 5, 0.8, 1.3), (0.0, 0, 1.0, 1.0), (1.2, 0, 0.5, 1.0), (0.9, 3, 1.0, 1.05),
         (0.3, 0, 0.95, 1.1)]


@pytest.mark.parametrize("sampling", [MIXED, [s for s in MIXED if s[2] >= 1.0], [(0.0, 0, 1.0, 1.05)] * 3,
                                      [(0.0, 0, 0.5, 1.0), (0.9, 50, 1.0, 1.05)]],
                         ids=["mixed", "no-top-p", "greedy", "top-p-on-a-greedy-row"])
def test_drawn_ids_are_the_reference_composition(sampling):
    generated = [0, 1, 2, 5, 40, 3][: len(sampling)]
    buffers, logits = step(sampling, generated)
    assert torch.equal(drawer()(logits, buffers), reference_ids(buffers, logits, SEEDS[: len(sampling)]))


def test_noise_base_from_the_host_is_the_devices_hash():
    seeds = torch.tensor(SEEDS, dtype=torch.long)
    steps = torch.tensor([0, 1, -3, 5, 2**31 + 7, -(2**40)], dtype=torch.long)
    index = torch.arange(V).expand(len(SEEDS), -1)
    from_host = torch.from_numpy(noise_base_on_host([seed_half_on_host(s) for s in SEEDS], steps.tolist()))
    assert torch.equal(unit(from_host[:, None], noise_part(CODEBOOK0_DRAW, torch.arange(V))[None, :]),
                       uniform_noise_at(seeds, steps, CODEBOOK0_DRAW, index))


def count_ops(fn, *args) -> Counter[str]:
    with OpCounter() as counter:
        fn(*args)
    return counter.ops


def test_a_step_hashes_only_the_noise_half_that_changes():
    # the (seed, draw) half comes from the fill and the (draw, index) half is kept: per step the device runs one
    # mix of the two, as `unit` alone does; the reference composition runs three more
    buffers, logits = step(MIXED, [0, 1, 2, 5, 40, 3])
    draw = drawer()
    ops = count_ops(draw, logits, buffers)
    alone = count_ops(unit, buffers.sample_noise_base[: len(MIXED), None], draw.noise_part)
    for bitwise in ("bitwise_xor", "__xor__", "__rshift__", "bitwise_right_shift"):  # the hash alone uses these
        assert ops[bitwise] == alone[bitwise], bitwise
    assert sum(ops.values()) < sum(count_ops(reference_ids, buffers, logits, SEEDS[: len(MIXED)]).values())


@pytest.mark.parametrize("sampling", [[(0.0, 0, 1.0, 1.05)] * 2, [(0.9, 50, 1.0, 1.05)] * 2,
                                      [(0.9, 50, 0.8, 1.05), (0.0, 0, 1.0, 1.0)]],
                         ids=["greedy", "no-top-p", "top-p"])
def test_the_draw_runs_the_same_ops_whatever_the_rows_settings(sampling):
    # a CUDA graph replays the ops of its capture: the draw may not choose its ops by the step's values
    mixed, logits = step(MIXED[:2], [3, 3])
    other, other_logits = step(sampling, [3, 3])
    assert count_ops(drawer(), other_logits, other) == count_ops(drawer(), logits, mixed)


def served(buffers: StepBuffers, expected_rows: int | None):
    """The parts of the served model `compute_logits` reads; the codec head passes hidden states through."""
    return types.SimpleNamespace(talker=types.SimpleNamespace(codec_head=lambda h: h), buffers=buffers,
                                 suppressed=drawer().suppressed, _step_sample_rows=expected_rows, last_draw_s=None)


def test_compute_logits_hands_vllm_the_forwards_draw_once_per_filled_step():
    buffers, logits = step(MIXED[:3], [0, 1, 2])
    drawn = drawer()(logits, buffers)
    buffers.codebook0_logits[:3].fill_(float("-inf")).scatter_(1, drawn[:, None], 0.0)  # as the forward writes it
    m = served(buffers, buffers.sample_rows)
    out = Qwen3TTSForVllm.compute_logits(m, torch.zeros(3, V))
    assert bool((torch.isfinite(out).sum(dim=1) == 1).all()) and torch.equal(out.argmax(dim=1), drawn)
    assert m._step_sample_rows is None and m.last_draw_s is not None
    # a later call without a filled step (vLLM's dummy sampler run): the codec head's logits, suppressed ids masked
    hidden = torch.randn(2, V)
    dummy = Qwen3TTSForVllm.compute_logits(m, hidden)
    assert torch.equal(dummy[:, :60], hidden[:, :60]) and bool(torch.isinf(dummy[:, 61:]).all())


def test_compute_logits_refuses_rows_that_are_not_the_filled_steps_requests():
    buffers, _ = step(MIXED[:3], [0, 1, 2])
    with pytest.raises(RuntimeError, match="samples 2 rows of a step whose layout has 3 requests"):
        Qwen3TTSForVllm.compute_logits(served(buffers, buffers.sample_rows), torch.zeros(2, V))


@pytest.mark.gpu
def test_a_captured_draw_replays_each_steps_settings():
    # captured once with one step's settings, replayed after a fill of another: the ids of an eager draw
    buffers = StepBuffers(max_tokens=16, max_slots=8, hidden_size=H, dtype=torch.float32, device="cuda",
                          vocab_size=V)
    draw = Codebook0Draw(RULES, drawer().suppressed.cuda())
    logits = torch.zeros(len(MIXED), V, device="cuda")
    static = draw(logits, buffers)  # warm-up on the side stream's allocator before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = draw(logits, buffers)
    for sampling in (MIXED, [(0.0, 0, 1.0, 1.05)] * len(MIXED), list(reversed(MIXED))):
        cpu, cpu_logits = step(sampling, [0, 1, 2, 5, 40, 3])
        for name in ("sample_slot", "sample_noise_base", "sample_step", "sample_top_k", "sample_temperature",
                     "sample_top_p", "sample_penalty", "suppress_eos", "seen"):
            getattr(buffers, name).copy_(getattr(cpu, name))
        logits.copy_(cpu_logits)
        graph.replay()
        assert torch.equal(static, draw(logits, buffers))
