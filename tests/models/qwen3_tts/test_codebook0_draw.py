"""Codebook 0's draw in `Qwen3TTSForVllm.compute_logits`: the same ids as the reference composition (talker rules,
`sample` with the counter noise of `uniform_noise_at`), with fewer ops launched a step (Model Runner V2 runs it
eagerly on the engine's thread, one kernel launch per op)."""

import types
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_voxserve.models.qwen3_tts.sampling import apply_talker_rules, sample
from vllm_voxserve.models.qwen3_tts.step_buffers import ServedRequest, StepBuffers
from vllm_voxserve.models.qwen3_tts.vllm_model import CODEBOOK0_DRAW, Qwen3TTSForVllm
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


def model(buffers: StepBuffers):
    """The parts of the served model `compute_logits` reads; the codec head passes logits through."""
    suppressed = torch.zeros(V, dtype=torch.bool)
    suppressed[list(RULES.suppressed_ids)] = True
    m = types.SimpleNamespace(talker=types.SimpleNamespace(codec_head=lambda h: h), buffers=buffers, rules=RULES,
                              eos_id=EOS, suppressed=suppressed)
    m._noise_part = types.MethodType(Qwen3TTSForVllm._noise_part, m)
    return m


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


def drawn(m, logits: torch.Tensor) -> torch.Tensor:
    out = Qwen3TTSForVllm.compute_logits(m, logits)
    assert bool((torch.isfinite(out).sum(dim=1) == 1).all())  # one finite logit a row: the drawn id
    return out.argmax(dim=1)


MIXED = [(0.9, 50, 1.0, 1.05), (0.7, 5, 0.8, 1.3), (0.0, 0, 1.0, 1.0), (1.2, 0, 0.5, 1.0), (0.9, 3, 1.0, 1.05),
         (0.3, 0, 0.95, 1.1)]


@pytest.mark.parametrize("sampling", [MIXED, [s for s in MIXED if s[2] >= 1.0], [(0.0, 0, 1.0, 1.05)] * 3,
                                      [(0.0, 0, 0.5, 1.0), (0.9, 50, 1.0, 1.05)]],
                         ids=["mixed", "no-top-p", "greedy", "top-p-on-a-greedy-row"])
def test_drawn_ids_are_the_reference_composition(sampling):
    generated = [0, 1, 2, 5, 40, 3][: len(sampling)]
    buffers, logits = step(sampling, generated)
    assert torch.equal(drawn(model(buffers), logits), reference_ids(buffers, logits, SEEDS[: len(sampling)]))


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
    # mix of the two, as `unit` alone does; before, three more mixes ran on every step
    buffers, logits = step(MIXED, [0, 1, 2, 5, 40, 3])
    m = model(buffers)
    Qwen3TTSForVllm.compute_logits(m, logits)  # the kept half is made on the first call
    ops = count_ops(Qwen3TTSForVllm.compute_logits, m, logits)
    alone = count_ops(unit, buffers.sample_noise_base[: len(MIXED), None], m._noise_part(V, logits.device))
    for bitwise in ("bitwise_xor", "__xor__", "__rshift__", "bitwise_right_shift"):  # the hash alone uses these
        assert ops[bitwise] == alone[bitwise], bitwise
    assert sum(ops.values()) < sum(count_ops(reference_ids, buffers, logits, SEEDS[: len(MIXED)]).values())


def test_top_p_and_the_draw_run_only_when_a_row_needs_them():
    def ops_for(sampling):
        buffers, logits = step(sampling, [3] * len(sampling))
        return count_ops(Qwen3TTSForVllm.compute_logits, model(buffers), logits)

    assert ops_for([(0.9, 50, 0.8, 1.05), (0.9, 50, 1.0, 1.05)])["cumsum"] == 1
    assert ops_for([(0.9, 50, 1.0, 1.05), (0.0, 0, 0.5, 1.05)])["cumsum"] == 0  # the greedy row's top_p is moot
    greedy = ops_for([(0.0, 0, 1.0, 1.05)] * 2)
    assert greedy["sort"] == 0 and greedy["cumsum"] == 0
