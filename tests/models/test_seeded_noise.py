import torch

from vllm_voxserve.models.seeded_noise import uniform_noise


def test_noise_depends_only_on_seed_and_step_not_on_the_batch():
    seeds, steps = torch.tensor([7, 7, 8, 7]), torch.tensor([0, 1, 0, 0])
    batch = uniform_noise(seeds, steps, draws=15, size=2048)
    alone = uniform_noise(seeds[2:3], steps[2:3], draws=15, size=2048)
    torch.testing.assert_close(batch[2], alone[0], rtol=0, atol=0)
    torch.testing.assert_close(batch[0], batch[3], rtol=0, atol=0)  # same seed and step: same draws
    assert not torch.equal(batch[0], batch[1]) and not torch.equal(batch[0], batch[2])


def test_noise_is_strictly_inside_zero_one_and_roughly_uniform():
    u = uniform_noise(torch.arange(64), torch.zeros(64, dtype=torch.long), draws=15, size=2048)
    assert u.dtype == torch.float32 and float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert float((hist - 0.1).abs().max()) < 0.01
