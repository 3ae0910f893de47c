import logging

from vllm_voxserve import plugin


def test_our_info_lines_reach_vllms_log_handler():
    plugin.register()
    ours = logging.getLogger("vllm_voxserve.step_host_times")
    vllm_handlers = logging.getLogger("vllm").handlers
    assert vllm_handlers, "vLLM configures its logger on import"
    assert ours.isEnabledFor(logging.INFO)
    assert logging.getLogger("vllm_voxserve").handlers == vllm_handlers
