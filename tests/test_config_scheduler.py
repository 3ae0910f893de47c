"""`voxserve.scheduler` is the scheduling policy's config, checked when the config is built (start-up)."""

import pytest

from vllm_voxserve.config import VoxServeConfig


def test_policy_takes_slo_and_chunking_from_the_top_level():
    config = VoxServeConfig.from_tree({"ttfa_slo_ms": 300, "first_chunk_frames": 5, "chunk_frames": 12,
                                       "scheduler": {"admission_mode": "prefill_first", "overload_mode": "off",
                                                     "demand_horizons_s": [1, 2]}})
    policy = config.scheduler_policy()
    assert (policy.ttfa_target_s, policy.first_chunk_frames, policy.chunk_frames) == (0.3, 5, 12)
    assert (policy.admission_mode, policy.overload_mode, policy.demand_horizons_s) == ("prefill_first", "off",
                                                                                        (1.0, 2.0))
    assert VoxServeConfig().scheduler_policy().deadline_aware  # deadline-aware by default


def test_policy_batches_follow_the_lanes_largest_executables():
    lanes = {"background_max_batch": 64, "urgent_buckets": [1, 2, 4]}
    policy = VoxServeConfig.from_tree({"lanes": lanes}).scheduler_policy()
    assert (policy.background_max_batch, policy.urgent_max_batch) == (64, 4)
    with pytest.raises(ValueError, match="it follows voxserve.lanes.background_max_batch"):
        VoxServeConfig.from_tree({"lanes": lanes, "scheduler": {"background_max_batch": 16}})


@pytest.mark.parametrize("scheduler, message", [
    ({"admision_mode": "prefill_first"}, "unknown voxserve_internal keys \\['scheduler.admision_mode'\\]"),
    ({"admission_mode": "fifo"}, "admission_mode must be one of"),
    ({"overload_mode": "shed"}, "overload_mode must be one of"),
    ({"max_prefill_deferral_s": -1}, "max_prefill_deferral_s must be >= 0"),
    ({"ttfa_target_s": 0.3}, "use voxserve.ttfa_slo_ms"),
    ({"chunk_frames": 4}, "voxserve.chunk_frames"),
])
def test_bad_scheduler_settings_fail_at_start_up(scheduler, message):
    with pytest.raises(ValueError, match=message):
        VoxServeConfig.from_tree({"scheduler": scheduler})
