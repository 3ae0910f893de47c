import json

import pytest
import torch

from benchmarks.split_chooser import (CODEC_HEADROOM, SplitMeasurement, Workload, choose_split, codec_step_factory,
                                      main, profile_splits, split_from_fig3)
from vllm_voxserve.codec_lanes import SplitSpec
from vllm_voxserve.config import LaneSplitConfig, process_config

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


def test_the_split_figure_3_chose_is_served_only_when_it_keeps_up(tmp_path, capsys):
    config = {"voxserve": {"lanes": {"backbone_priority": "least"}},
              "voxserve_internal": {"lanes": {"background_max_batch": 32}}}
    chosen, _ = split_from_fig3({"chosen_codec_sms": 48, "chosen_keeps_up": True}, json.loads(json.dumps(config)))
    assert chosen["voxserve"]["lanes"] == {"backbone_priority": "least", "split": {"group_sms": 48}}
    lanes = process_config(chosen).lanes  # what a server given this config serves
    assert (lanes.split, lanes.background_max_batch) == (LaneSplitConfig("codec", 48), 32)
    assert split_from_fig3({"chosen_codec_sms": 80, "chosen_keeps_up": False}, config)[0] == config
    plain = '{"voxserve":{"codec_dtype":"bfloat16"}}'
    (tmp_path / "fig3.json").write_text(json.dumps({"chosen_codec_sms": 48, "chosen_keeps_up": True}))
    assert main(["--split-from", str(tmp_path / "fig3.json"), plain]) == 0
    assert json.loads(capsys.readouterr().out)["voxserve"]["lanes"]["split"]["group_sms"] == 48
    main(["--split-from", str(tmp_path / "missing.json"), plain])
    assert json.loads(capsys.readouterr().out) == json.loads(plain)
    assert main(["fig3.json"]) == 2


@pytest.mark.gpu
@torch.no_grad()
def test_split_chooser_profiles_candidate_splits():
    from tests.codec_lanes.test_gpu_lanes import report, toy_backbone
    from tests.codec_lanes.toy_codec import ToyCodec

    codec = ToyCodec(channels=2048, layers=16, samples_per_frame=1920, dtype=torch.bfloat16, device="cuda")
    work = Workload(backbone_batch=64, codec_batch=16, frames_per_chunk=10)
    candidates = [SplitSpec("codec", n) for n in (16, 24, 32, 48, 64)]
    results = profile_splits(candidates, toy_backbone(), codec_step_factory(codec, 10, torch.device("cuda")),
                             work, window_ms=100.0)
    choice = choose_split(results)
    report("split_chooser", workload=[work.backbone_batch, work.codec_batch, work.frames_per_chunk],
           table=[dict(lm_sms=m.lm_sms, codec_sms=m.codec_sms, step_ms=round(m.backbone_step_ms, 4),
                       codec_batch_ms=round(m.codec_batch_ms, 4), backbone_fps=round(m.backbone_frames_per_s),
                       codec_fps=round(m.codec_frames_per_s), margin=round(m.codec_margin, 2)) for m in results],
           chosen_codec_sms=choice.best.codec_sms, chosen_keeps_up=choice.codec_keeps_up)
    assert [m.codec_sms for m in results] == sorted(m.codec_sms for m in results)
    assert all(m.lm_sms + m.codec_sms <= 132 for m in results)
    assert results[-1].codec_batch_ms < results[0].codec_batch_ms  # 64 codec SMs beat 16
