"""The engine-core end of the mode call: `vllm-stock` is the scheduler's switch plus the workers' inline codec;
`CODEC+ADMISSION` is the workers' codec mode plus the scheduler's admission mode."""

import pytest

from vllm_voxserve.scheduler.serving_mode import STOCK_MODE, ServingMode, handle_mode_call, parse_mode


class FakeScheduler:
    configured_admission_mode = "deadline_aware"

    def __init__(self):
        self.stock, self.busy, self.admission_mode = False, False, "deadline_aware"

    def has_requests(self):
        return self.busy

    def set_policy(self, stock, admission_mode):
        self.stock, self.admission_mode = stock, admission_mode


class FakeWorkers:
    """Two workers that accept inline/lanes while idle, like `codec_mode_call`."""

    def __init__(self):
        self.current, self.calls = "inline", []

    def __call__(self, mode):
        self.calls.append(mode)
        if mode is None:
            return [self.reply(200)] * 2
        if mode not in ("inline", "lanes"):
            return [{**self.reply(400), "error": f"unknown codec mode {mode!r}"}] * 2
        self.current = mode
        return [self.reply(200)] * 2

    def reply(self, status):
        return {"status": status, "modes": ["inline", "lanes"], "current": self.current}


def test_report_lists_the_stock_mode():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    replies = handle_mode_call(scheduler, None, workers)
    modes = ["inline", "lanes", STOCK_MODE, "inline+prefill_first", "lanes+prefill_first"]
    assert replies == [{"status": 200, "modes": modes, "current": "inline"}] * 2


def test_mode_names():
    assert parse_mode("lanes") == ServingMode("lanes", False, None)
    assert parse_mode(STOCK_MODE) == ServingMode("inline", True, None)
    assert parse_mode("lanes+prefill_first") == ServingMode("lanes", False, "prefill_first")
    with pytest.raises(ValueError, match="admission mode 'fifo'"):
        parse_mode("lanes+fifo")


def test_stock_mode_sets_the_scheduler_and_an_inline_codec_and_back():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    handle_mode_call(scheduler, "lanes", workers)
    replies = handle_mode_call(scheduler, STOCK_MODE, workers)
    assert workers.calls[-1] == "inline" and scheduler.stock
    assert {r["current"] for r in replies} == {STOCK_MODE}
    assert handle_mode_call(scheduler, None, workers)[0]["current"] == STOCK_MODE
    replies = handle_mode_call(scheduler, "inline", workers)  # the same codec mode: only the policy changes
    assert not scheduler.stock and {r["current"] for r in replies} == {"inline"}


def test_busy_or_bad_requests_change_nothing():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    scheduler.busy = True
    replies = handle_mode_call(scheduler, STOCK_MODE, workers)
    assert {r["status"] for r in replies} == {409} and not scheduler.stock and workers.calls == [None]
    scheduler.busy = False
    replies = handle_mode_call(scheduler, "time_sharing", workers)
    assert {r["status"] for r in replies} == {400} and not scheduler.stock


def test_an_admission_mode_switches_the_scheduler_and_the_codec_and_a_plain_name_restores_the_configured_one():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    replies = handle_mode_call(scheduler, "lanes+prefill_first", workers)
    assert workers.calls[-1] == "lanes" and scheduler.admission_mode == "prefill_first" and not scheduler.stock
    assert {r["current"] for r in replies} == {"lanes+prefill_first"}
    assert handle_mode_call(scheduler, None, workers)[0]["current"] == "lanes+prefill_first"
    handle_mode_call(scheduler, STOCK_MODE, workers)  # vLLM's policy: the admission mode is the configured one
    assert scheduler.stock and scheduler.admission_mode == "deadline_aware"
    replies = handle_mode_call(scheduler, "lanes", workers)
    assert {r["current"] for r in replies} == {"lanes"} and scheduler.admission_mode == "deadline_aware"


def test_an_unknown_admission_mode_is_rejected_before_the_workers_switch():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    replies = handle_mode_call(scheduler, "lanes+fifo", workers)
    assert {r["status"] for r in replies} == {400} and "fifo" in replies[0]["error"]
    assert workers.calls == [None] and workers.current == "inline" and scheduler.admission_mode == "deadline_aware"


def test_a_failed_codec_switch_leaves_the_admission_mode():
    scheduler, workers = FakeScheduler(), FakeWorkers()
    replies = handle_mode_call(scheduler, "two-stream+prefill_first", workers)
    assert {r["status"] for r in replies} == {400} and scheduler.admission_mode == "deadline_aware"


def test_a_switch_one_worker_refuses_puts_the_others_back_and_keeps_the_policy():
    """One worker has no memory for the new codec mode (503), the other switched: it is switched back."""

    class OneRefuses(FakeWorkers):
        def __call__(self, mode):
            self.calls.append(mode)
            if mode in (None, "inline"):
                return [self.reply(200)] * 2
            return [{**self.reply(200), "current": mode}, {**self.reply(503), "error": "not enough device memory"}]

    scheduler, workers = FakeScheduler(), OneRefuses()
    replies = handle_mode_call(scheduler, "lanes+prefill_first", workers)
    assert workers.calls == ["lanes", "inline"]
    assert [r["status"] for r in replies] == [200, 503]
    assert scheduler.admission_mode == "deadline_aware" and not scheduler.stock
