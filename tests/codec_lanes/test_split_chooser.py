import pytest

from vllm_voxserve.codec_lanes import LmLane, SplitSpec, cpu_partitions
from vllm_voxserve.codec_lanes.split_chooser import CODEC_HEADROOM, SplitMeasurement, Workload, choose_split

WORK = Workload(backbone_batch=64, codec_batch=16, frames_per_chunk=10)


def measured(codec_sms, step_ms, batch_ms, total=132):
    return SplitMeasurement(SplitSpec("codec", codec_sms), total - codec_sms, codec_sms, step_ms, batch_ms, WORK)


def test_rates_follow_from_the_workload():
    m = measured(24, step_ms=10.0, batch_ms=20.0)
    assert m.backbone_frames_per_s == pytest.approx(6400)  # 64 frames per 10 ms
    assert m.codec_frames_per_s == pytest.approx(8000)  # 160 frames per 20 ms
    assert m.codec_margin == pytest.approx(1.25)


def test_picks_the_fastest_backbone_among_splits_whose_codec_keeps_up_with_headroom():
    splits = [
        measured(16, step_ms=9.5, batch_ms=40.0),  # fastest backbone, codec 4000 < 6737: falls behind
        measured(24, step_ms=9.8, batch_ms=24.0),  # codec 6667 >= 6531 but only 1.02x
        measured(32, step_ms=10.5, batch_ms=18.0),  # 8889 / 6095 = 1.46x: keeps up, slower backbone
        measured(48, step_ms=11.0, batch_ms=12.0),  # keeps up, slower still
    ]
    choice = choose_split(splits)
    assert 1.02 < CODEC_HEADROOM <= 1.46
    assert choice.codec_keeps_up and choice.best.codec_sms == 32
    assert choose_split(splits, headroom=1.0).best.codec_sms == 24  # no headroom: the bare rate comparison


def test_codec_bound_model_gets_the_balanced_split():
    splits = [measured(s, step_ms=10.0, batch_ms=b) for s, b in ((24, 200.0), (64, 90.0), (96, 60.0))]
    splits[2] = measured(96, step_ms=40.0, batch_ms=120.0)  # codec 1333 frames/s, backbone 1600
    choice = choose_split(splits)
    assert not choice.codec_keeps_up and choice.best.codec_sms == 64  # min(6400, 1778) is the best min


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        choose_split([])
    with pytest.raises(ValueError):
        Workload(0, 1, 1)
    with pytest.raises(ValueError):
        SplitSpec("vocoder", 24)
    with pytest.raises(ValueError):
        SplitSpec("codec", 0)


def test_lm_lane_on_cpu_runs_steps_in_place():
    lane = LmLane(cpu_partitions())
    with lane.step(prefill=True) as stream:
        assert stream is None
    with lane.capturing():
        pass
