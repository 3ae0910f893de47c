"""The side-by-side timing of benchmarks.backbone_priority counts only replays that ran beside the other side."""

import pytest

from benchmarks.backbone_priority import mean_inside_common_span


def test_only_replays_inside_the_common_span_count():
    backbone = [0.0, 10.0, 22.0, 34.0, 46.0, 50.0]  # its first and last replays ran partly alone (faster)
    codec = [5.0, 25.0, 45.0]
    assert mean_inside_common_span([backbone, codec]) == [12.0, 20.0]


def test_sides_that_never_overlap_fail():
    with pytest.raises(RuntimeError, match="raise the window"):
        mean_inside_common_span([[0.0, 1.0, 2.0], [3.0, 4.0]])
