"""The scheduler host-time benchmark drives vLLM's real scheduler with our policy at a steady load on a fake clock."""

import pytest

pytest.importorskip("vllm")

from benchmarks import scheduler_host  # noqa: E402


def test_a_steady_load_runs_as_many_rows_as_arrivals_times_their_length():
    rate, step_s, frames = 50.0, 0.02, 20
    r = scheduler_host.run(rate, step_s, steps=60, warmup=60, frames=frames, drain_steps=5,
                           tree={"first_chunk_frames": 5, "max_codec_slots": 512,
                                 "scheduler": {"max_decode_batch": 384}}, profile=None)
    # Little's law: lengths spread around `frames` (one prefill step each), arrivals every 1/rate s
    assert r["running_mean"] == pytest.approx(rate * (frames + 1) * step_s, rel=0.3)
    assert r["schedule_ms_p50"] > 0 and r["update_ms_p50"] > 0
