"""Adapter to vLLM's Model Runner V2 (what vLLM 0.26 runs on GPU): its documented per-model `ModelState` hook.

Hooks (vLLM 0.26.0 `v1/worker/gpu/model_states/interface.py`): `add_request` / `remove_request` (request
lifecycle), `prepare_inputs` (eager, before every forward, with the final batch), `postprocess_state` (after
sampling). The forward itself may be a CUDA graph replay: it only reads the model's persistent step buffers.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.model_states.default import DefaultModelState

from vllm_voxserve.config import process_config
from vllm_voxserve.models.step_layout import StepLayout
from vllm_voxserve.worker.runtime import SpeechRuntime


class SpeechModelState(DefaultModelState):
    def __init__(self, vllm_config, model, encoder_cache, device):
        super().__init__(vllm_config, model, encoder_cache, device)
        self.speech = SpeechRuntime(model, process_config(vllm_config.additional_config), device)

    def add_request(self, req_index, new_req_data) -> None:
        super().add_request(req_index, new_req_data)
        self.speech.start(new_req_data.req_id, len(new_req_data.prompt_token_ids),
                          new_req_data.sampling_params.extra_args)

    def remove_request(self, req_id: str) -> None:
        self.speech.finish(req_id)
        super().remove_request(req_id)

    def prepare_inputs(self, input_batch, req_states):
        n = input_batch.num_reqs
        self.speech.prepare_step(StepLayout(
            tuple(input_batch.req_ids[:n]),
            tuple(int(t) for t in input_batch.num_scheduled_tokens[:n]),
            tuple(int(t) for t in input_batch.num_computed_tokens_np[:n]),
        ))
        return super().prepare_inputs(input_batch, req_states)

    def postprocess_state(self, idx_mapping, num_sampled, num_computed_tokens=None) -> None:
        super().postprocess_state(idx_mapping, num_sampled, num_computed_tokens)
        self.speech.after_forward()
