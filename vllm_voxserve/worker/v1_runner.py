"""Adapter to vLLM's V1 model runner (what vLLM 0.26 runs on CPU): reads its batch state into a StepLayout.

Hooks (vLLM 0.26.0 `v1/worker/gpu_model_runner.py`): `_update_states` (requests start and finish), `_preprocess`
(runs after the batch is final, before the forward), `_model_forward` (the forward of a real step; dummy and
profiling runs call the model directly and skip it), `sample_tokens` (its output carries the speech step report to
the scheduler, `compat.attach_step_report`).
"""

from __future__ import annotations

from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from vllm_voxserve.compat import attach_step_report
from vllm_voxserve.config import process_config
from vllm_voxserve.models.step_layout import StepLayout
from vllm_voxserve.worker.runtime import SpeechRuntime


class V1SpeechHooks:
    """Mixin for a V1 model runner class (CPU or GPU)."""

    speech: SpeechRuntime | None = None

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self.speech = SpeechRuntime(self.model, process_config(self.vllm_config.additional_config), self.device)

    def _update_states(self, scheduler_output):
        for req_id in scheduler_output.finished_req_ids:
            self.speech.finish(req_id)
        result = super()._update_states(scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            self.speech.start(new.req_id, len(new.prompt_token_ids), new.sampling_params.extra_args)
        return result

    def _preprocess(self, scheduler_output, num_input_tokens, intermediate_tensors=None):
        batch = self.input_batch
        req_ids = tuple(batch.req_ids[: batch.num_reqs])
        self.speech.prepare_step(StepLayout(
            req_ids,
            tuple(scheduler_output.num_scheduled_tokens[r] for r in req_ids),
            tuple(int(n) for n in batch.num_computed_tokens_cpu[: batch.num_reqs]),
        ))
        return super()._preprocess(scheduler_output, num_input_tokens, intermediate_tensors)

    def _model_forward(self, *args, **kwargs):
        output = super()._model_forward(*args, **kwargs)
        self.speech.after_forward()
        return output

    def sample_tokens(self, grammar_output):
        output = super().sample_tokens(grammar_output)
        if self.speech is not None:
            attach_step_report(output, lambda: self.speech.step_report(costs=self.device.type == "cpu"))
        return output


class VoxServeCPUModelRunner(V1SpeechHooks, CPUModelRunner):
    pass
