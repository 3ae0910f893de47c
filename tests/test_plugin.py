import logging

from vllm_voxserve import plugin


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_our_info_lines_reach_the_handlers_vllm_has_when_they_are_logged():
    plugin.register()
    ours = logging.getLogger("vllm_voxserve.step_host_times")
    assert ours.isEnabledFor(logging.INFO)
    # a handler vLLM sets up after plugins load (where its logging is configured per LoggingConfig)
    later = Collect()
    logging.getLogger("vllm").addHandler(later)
    try:
        ours.info("step host time %d ms", 7)
    finally:
        logging.getLogger("vllm").removeHandler(later)
    assert later.lines == ["step host time 7 ms"]
    plugin.register()
    from vllm_voxserve import compat

    # idempotent: still one forwarding handler (pytest's capture handlers may sit beside it)
    compat.log_through_vllm()
    handlers = logging.getLogger("vllm_voxserve").handlers
    assert sum(isinstance(h, compat._ToVllmHandlers) for h in handlers) == 1
