"""`voxserve.lanes` is parsed and checked when the config is built (start-up), not when the lanes are."""

import pytest

from vllm_voxserve.config import (CodecMode, LanesConfig, LaneSplitConfig, VoxServeConfig, as_additional_config,
                                   backbone_stream_priority, process_config)


def test_lanes_default_to_the_chunk_sizes_and_round_trip():
    config = VoxServeConfig.from_dict({"codec_mode": "lanes", "first_chunk_frames": 5, "chunk_frames": 10,
                                       "lanes": {"split": {"group_sms": 16}}},
                                      internal={"lanes": {"urgent_buckets": [1, 2]}})
    assert config.codec_mode is CodecMode.LANES
    assert config.lanes == LanesConfig(frame_counts=(5, 10), urgent_buckets=(1, 2),
                                       split=LaneSplitConfig("codec", 16))
    assert VoxServeConfig.from_tree(config.to_dict()) == config
    assert process_config(as_additional_config(config.to_dict())) == config
    assert VoxServeConfig().lanes.frame_counts == (5, 10)  # the default first chunk, then the others
    assert VoxServeConfig(codec_mode="lanes").codec_mode is CodecMode.LANES


@pytest.mark.parametrize("lanes, message", [
    ({"frame_count": [10]}, "unknown voxserve_internal keys \\['lanes.frame_count'\\]"),
    ({"frame_counts": [4, 8]}, "must contain the chunk sizes"),
    ({"frame_counts": [10, 0]}, "positive integer"),
    ({"urgent_buckets": []}, "must not be empty"),
    ({"background_max_batch": 0}, "positive integer"),
    ({"background_bucket_step": -8}, "background_bucket_step must be a positive integer"),
    ({"use_graphs": "yes"}, "true or false"),
    ({"split": {"group": "both"}}, "'codec' or 'lm'"),
    ({"split": {"sms": 8}}, "unknown voxserve_internal keys \\['lanes.split.sms'\\]"),
    ({"split": 8}, "must be an object"),
    ({"backbone_priority": "urgent"}, "backbone_priority must be one of"),
    (3, "must be an object"),
])
def test_bad_lanes_fail_at_start_up(lanes, message):
    with pytest.raises(ValueError, match=message):
        VoxServeConfig.from_tree({"lanes": lanes})


def test_the_cost_models_codec_share_and_the_policys_batches_follow_the_lanes():
    assert VoxServeConfig().scheduler_policy().codec_sms == VoxServeConfig().lanes.split.group_sms
    lanes = {"split": {"group_sms": 24}, "background_max_batch": 32, "urgent_buckets": [1, 2]}
    policy = VoxServeConfig.from_tree({"lanes": lanes}).scheduler_policy()
    assert (policy.codec_sms, policy.background_max_batch, policy.urgent_max_batch) == (24, 32, 2)


@pytest.mark.parametrize(("key", "source"), [("codec_sms", "voxserve.lanes.split"),
                                             ("background_max_batch", "voxserve.lanes.background_max_batch"),
                                             ("urgent_max_batch", "voxserve.lanes.urgent_buckets"),
                                             ("frame_duration_s", "the codec's frame rate")])
def test_derived_policy_keys_are_refused_naming_their_source(key, source):
    with pytest.raises(ValueError, match=f"voxserve.scheduler must not set '{key}': it follows {source}"):
        VoxServeConfig.from_dict({"scheduler": {key: 1}})


@pytest.mark.parametrize("setting, least, greatest, priority", [
    ("least", 0, -5, 0),
    ("high", 0, -5, -1),  # above the background lane (least), below the urgent lane (greatest)
    ("high", 0, -3, -1),  # torch's own range on the H200
    ("high", 0, -1, -1),  # two levels: the urgent lane's
    ("high", 0, 0, 0),  # a device without priorities
])
def test_the_backbone_priority_lies_between_the_background_and_the_urgent_lane(setting, least, greatest, priority):
    assert backbone_stream_priority(setting, least, greatest) == priority
    assert LanesConfig(backbone_priority=setting).backbone_priority == setting
