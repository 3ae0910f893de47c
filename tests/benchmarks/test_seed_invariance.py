import numpy as np

from benchmarks.seed_invariance import SAMPLES_PER_FRAME, frame_errors, summarize


def test_frame_errors_find_the_first_differing_frame_and_missing_ones():
    rng = np.random.default_rng(0)
    alone = (rng.standard_normal(4 * SAMPLES_PER_FRAME) * 3000).astype(np.int16)
    batched = alone.copy()
    batched[2 * SAMPLES_PER_FRAME:] = (rng.standard_normal(2 * SAMPLES_PER_FRAME) * 3000).astype(np.int16)
    errors = frame_errors(alone, batched[: 3 * SAMPLES_PER_FRAME])
    assert errors[:2] == [0.0, 0.0] and errors[2] > 0.5 and errors[3] == 1.0


def test_summary_counts_frames_prefixes_and_whole_probes():
    summary = summarize([[0.0, 0.01, 0.2, 0.0], [0.0, 0.0]], tolerance=0.05)
    assert summary["frames_matching"] == 5 / 6
    assert summary["probes_matching_whole"] == 0.5
    assert summary["mean_matching_prefix"] == (2 / 4 + 1) / 2
