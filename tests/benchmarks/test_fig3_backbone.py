"""The Figure 3 backbone step runs (tiny shapes, CPU, eager) and yields one frame of codes per request."""

import torch

from benchmarks.fig3.backbone import backbone_step_factory


def test_backbone_step_makes_a_frame_per_request():
    make_step = backbone_step_factory("tiny", context=8, device="cpu", dtype=torch.float32, compile=False)
    codes = make_step(3)()
    assert codes.shape == (3, 16)
    assert int(codes[:, 1:].max()) < 2048 and int(codes.min()) >= 0
    assert torch.equal(make_step(3)(), codes)  # deterministic per batch size
