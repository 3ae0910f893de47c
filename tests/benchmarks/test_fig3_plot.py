"""Figure 3's plot from a measurement record (synthetic numbers), and its time-sharing rule."""

from benchmarks.fig3.plot import above_time_sharing, backbone_share, draw, throughputs


def record():
    side = [dict(lm_sms=132 - s, codec_sms=s, backbone_step_ms=10 + s / 8, codec_batch_ms=80 - s,
                 codec_batch1_ms=6.0, backbone_frames_per_s=64000 / (10 + s / 8),
                 codec_frames_per_s=160000 / (80 - s), keeps_up=False) for s in (16, 24, 32)]
    return dict(gpu="test GPU", sm_count=132, codec_dtype="bf16",
                workload=dict(backbone_batch=64, codec_batch=16, frames=10),
                whole_gpu=dict(backbone_step_ms=10.0, codec_batch1_ms=3.0, codec_batch16_ms=15.0),
                alone=[dict(lm_sms=132 - s, codec_sms=s, backbone_step_ms=10 + s / 10, codec_batch1_ms=7.0)
                       for s in (16, 24, 32)],
                side_by_side=side, chosen_codec_sms=24, chosen_keeps_up=False, seconds=1.0)


def test_time_sharing_line():
    ends = throughputs(record())
    assert ends == {"backbone": 6400.0, "codec": 16 * 10 * 1000 / 15.0}
    half = dict(backbone_frames_per_s=ends["backbone"] / 2, codec_frames_per_s=ends["codec"] / 2)
    assert not above_time_sharing(half, ends)  # on the line is not above it
    assert above_time_sharing(dict(backbone_frames_per_s=0.9 * ends["backbone"],
                                   codec_frames_per_s=0.2 * ends["codec"]), ends)


def test_backbone_share_uses_the_whole_gpu_step_timed_beside_it():
    whole = dict(backbone_step_ms=10.0)
    assert backbone_share(dict(backbone_step_ms=12.5), whole) == 0.8  # older records: the one whole-GPU figure
    assert backbone_share(dict(backbone_step_ms=12.5, backbone_whole_gpu_ms=11.25), whole) == 0.9


def test_draws_a_png(tmp_path):
    out = draw(record(), tmp_path / "fig3.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draws_what_a_run_cut_short_saved(tmp_path):
    partial = record()
    partial.update(side_by_side=[], alone=partial["alone"][:1])
    del partial["chosen_codec_sms"], partial["chosen_keeps_up"]
    assert draw(partial, tmp_path / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
