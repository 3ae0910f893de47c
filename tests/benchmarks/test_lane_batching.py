"""The lanes' batching on a simulated clock (benchmarks/lane_batching.py): the worker's real pipeline and dispatch,
each codec batch finishing after its simulated device time. At one load, the engine's step interval alone decides
whether the background lane runs full batches a few steps apart or a small batch at every step."""

from benchmarks import lane_batching
from vllm_voxserve.codec_lanes import codec_lane


def test_longer_steps_turn_full_background_batches_into_one_small_batch_a_step():
    fast, slow = (lane_batching.run(150, step_s, steps=150, frames=97, warmup=150, profile=None)
                  for step_s in (0.0145, 0.020))
    # 150 streams make a frame each a step: the shorter steps make frames faster than the 64-SM lane decodes them
    assert fast["background"]["busy"] > slow["background"]["busy"]
    assert fast["background"]["mean_batch"] > 2 * slow["background"]["mean_batch"]
    assert slow["background"]["batches_per_step"] > 2 * fast["background"]["batches_per_step"]
    # the pump launches, harvests and delivers a background batch in (almost) every step only at the longer one
    assert slow["background"]["batches_per_step"] > 0.9
    assert fast["turned_urgent_per_step"] == slow["turned_urgent_per_step"] == 0  # no chunk misses its lead


def test_the_simulated_lanes_are_undone_after_a_run():
    launch = codec_lane.CodecLane.launch
    lane_batching.run(8, 0.02, steps=5, frames=20, warmup=5, profile=None)
    assert codec_lane.CodecLane.launch is launch
