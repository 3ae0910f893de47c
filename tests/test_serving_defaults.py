import pytest

from vllm_voxserve.serving_defaults import (
    ANCHOR_ROWS, CPU_ROWS, GiB, cores_per_sm, derive_serving_defaults, is_vllm_default, slots_for,
)


def test_the_h200_gets_its_best_measured_sizes():
    d = derive_serving_defaults("cuda", 132, 141 * 10**9, 2_000_000_000)
    assert (d.max_num_seqs, d.max_decode_batch, d.max_codec_slots) == (384, 384, 512)
    assert d.cost_seed == "h200" and "132 SMs" in d.describe()
    assert derive_serving_defaults("cuda", 132, 80 * GiB).cost_seed == "paper_h100"  # an H100: the paper's seed
    assert derive_serving_defaults("cuda", None, None).cost_seed == "paper_h100"


@pytest.mark.parametrize("sms", [None, 120, 148])
def test_large_or_unknown_gpus_get_the_anchor_rows(sms):
    assert derive_serving_defaults("cuda", sms, None).max_decode_batch == ANCHOR_ROWS


def test_rows_scale_down_with_sms_and_memory():
    by_sms = [derive_serving_defaults("cuda", sms, 80 * GiB).max_decode_batch for sms in (24, 58, 84, 108)]
    assert by_sms == sorted(by_sms) and by_sms[0] < by_sms[-1] < ANCHOR_ROWS
    assert all(rows % 32 == 0 and rows >= 32 for rows in by_sms)
    small = derive_serving_defaults("cuda", 132, 16 * GiB)
    assert small.max_decode_batch < ANCHOR_ROWS and "holds" in small.why
    # a larger model leaves fewer rows in the same memory
    assert (derive_serving_defaults("cuda", 132, 20 * GiB, 4_000_000_000).max_decode_batch
            < derive_serving_defaults("cuda", 132, 20 * GiB, 600_000_000).max_decode_batch)


def test_tiny_memory_still_serves_a_minimum():
    assert derive_serving_defaults("cuda", 132, 4 * GiB).max_decode_batch == 32


@pytest.mark.parametrize("kind", ["cpu", "xpu"])
def test_other_devices_stay_small(kind):
    d = derive_serving_defaults(kind, 132, 141 * 10**9)
    assert d.max_decode_batch == d.max_num_seqs == CPU_ROWS
    assert d.max_codec_slots > d.max_decode_batch


@pytest.mark.parametrize("rows, slots", [(384, 512), (128, 192), (32, 64), (96, 128)])
def test_slots_are_a_third_above_the_rows(rows, slots):
    assert slots_for(rows) == slots


def test_sm_count_from_cores():
    assert 16896 // cores_per_sm(9, 0) == 132  # H100/H200
    assert 6912 // cores_per_sm(8, 0) == 108  # A100
    assert 7424 // cores_per_sm(8, 9) == 58  # L4
    assert cores_per_sm(6, 0) is None


def test_a_cap_among_vllms_defaults_counts_as_unset():
    assert is_vllm_default(None, {256, 1024}) and is_vllm_default(1024, {256, 1024})
    assert not is_vllm_default(384, {256, 1024})
