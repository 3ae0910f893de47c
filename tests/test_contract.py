"""What crosses from the engine core to the API server when the scheduler refuses a request (pure)."""

from vllm_voxserve.contract import decode_rejection, encode_failure, encode_rejection


def test_a_rejection_round_trips_with_its_retry_after_its_reason_and_whether_its_limit_refused_it():
    reason = "server at capacity: 150 requests in progress, the most it has lately kept ... is 140"
    by_limit = decode_rejection(encode_rejection(1.0, reason, by_limit=True))
    assert by_limit == (1.0, reason, True)  # the reason's own colons survive
    by_load = decode_rejection(encode_rejection(2.345, "could not start audio within 200 ms"))
    assert (by_load.retry_after_s, by_load.reason, by_load.by_limit) == (2.345, "could not start audio within 200 ms",
                                                                         False)


def test_what_is_not_a_rejection_decodes_to_none():
    assert decode_rejection(None) is None and decode_rejection("stop") is None
    assert decode_rejection(encode_failure("worker lost")) is None
