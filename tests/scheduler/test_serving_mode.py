"""The engine-core end of the mode call: `vllm-stock` is the scheduler's switch plus the workers' inline codec."""

from vllm_voxserve.scheduler.serving_mode import STOCK_MODE, handle_mode_call


class FakeScheduler:
    def __init__(self):
        self.stock, self.busy = False, False

    def has_requests(self):
        return self.busy

    def set_stock(self, stock):
        self.stock = stock


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
    assert replies == [{"status": 200, "modes": ["inline", "lanes", STOCK_MODE], "current": "inline"}] * 2


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
