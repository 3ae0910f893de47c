"""One request's failure in the worker ends that request alone: its audio stream gets an error, the step report
names it for the scheduler, and the other streams go on (the server-side proof: tests/entrypoints/
test_fault_isolation_server.py)."""

from __future__ import annotations

import types

import pytest
import torch

from tests.worker.test_runtime_report import program, runtime_with  # noqa: F401 - program is a fixture
from vllm_voxserve.fault_injection import FAULT_ENV, FaultPlan, InjectedFault, slow_reference_delay
from vllm_voxserve.models.qwen3_tts.job import SpeechJob
from vllm_voxserve.models.qwen3_tts.prompt import SpeechPrompt
from vllm_voxserve.models.step_layout import StepLayout


class TalkerFake:
    """The talker side: one frame per decode row of a request it holds, none for a failed one."""

    def __init__(self):
        self.requests = {}
        self.rows = []

    def add_request(self, req_id, prompt_len, job, x_vector=None, ref_codes=None):
        self.requests[req_id] = types.SimpleNamespace(req_id=req_id, failed=None, seed=job.seed, frames=0)

    def add_placeholder_request(self, req_id, prompt_len):
        self.requests[req_id] = types.SimpleNamespace(req_id=req_id, failed=None, seed=0, frames=0)

    def remove_request(self, req_id):
        self.requests.pop(req_id, None)

    def prepare_step(self, layout, row_check=None):
        self.rows = []
        for rid, n in zip(layout.req_ids, layout.num_tokens):
            req = self.requests[rid]
            try:
                if row_check is not None:
                    row_check(req, req.frames)
            except Exception as exc:  # as StepBuffers.fill does
                req.failed = f"step set-up failed: {exc}"
            if n == 1 and not req.failed:
                self.rows.append(rid)
                req.frames += 1

    def take_frames(self):
        rows = [types.SimpleNamespace(req_id=rid) for rid in self.rows]
        return torch.zeros(len(rows), 16, dtype=torch.long), rows


def job_args(seed: int) -> dict:
    return SpeechJob(f"key{seed}", "ipc://unused", SpeechPrompt(text_ids=(1, 2), speaker="ryan"),
                     seed=seed).to_extra_args()


def serve(program, fault: FaultPlan, steps: int = 12):  # noqa: F811
    runtime = runtime_with(program, codec_mode="inline")
    runtime.model = TalkerFake()
    runtime.fault = runtime.pipeline.fault = fault
    ids = ("r7", "r8")
    for rid in ids:
        runtime.start(rid, 5, job_args(int(rid[1:])))
    reports = []
    for position in range(5, 5 + steps):
        live = tuple(r for r in ids if r in runtime.model.requests)
        runtime.prepare_step(StepLayout(live, (1,) * len(live), (position,) * len(live)))
        runtime.after_forward()
        reports.append(runtime.step_report())
    return runtime, reports


def sent(runtime, key: str) -> list:
    return [what for k, _, what in runtime.pipeline.sender.audio if k == key]


@pytest.mark.parametrize("stage", ["start", "step", "send"])
def test_a_fault_in_one_request_ends_it_alone_with_an_error(program, stage):  # noqa: F811
    runtime, reports = serve(program, FaultPlan(stage, 7, 2 if stage == "step" else 0))
    faulted, other = sent(runtime, "key7"), sent(runtime, "key8")
    assert len(faulted) >= 1 and isinstance(faulted[-1], str) and faulted[-1].startswith("ERROR")
    assert "injected" in faulted[-1] and stage in faulted[-1]
    assert all(not isinstance(x, str) for x in faulted[:-1])  # audio before it (if any), then the error, once
    assert not any(isinstance(x, str) for x in other) and len(other) >= 3  # the other kept streaming
    assert reports[-1].failed.keys() == {"r7"} and "injected" in reports[-1].failed["r7"]
    assert [p.request_id for p in reports[-1].progress] == ["r8"]
    runtime.finish("r7")  # vLLM finishes it (the scheduler did, from the report): nothing is left of it
    assert "r7" not in runtime._failed and runtime.step_report().failed == {}


def test_the_fault_hook_is_off_unless_the_environment_names_one():
    assert FaultPlan.from_env({}) is None and slow_reference_delay({}) == 0.0
    assert FaultPlan.from_env({FAULT_ENV: "step:5:3"}) == FaultPlan("step", 5, 3)
    with pytest.raises(ValueError, match=FAULT_ENV):
        FaultPlan.from_env({FAULT_ENV: "forward:5"})
    plan = FaultPlan("send", 5, 1)
    plan.check("send", 5, 0)  # before its frame
    plan.check("send", 6, 4)  # another request
    plan.check("step", 5, 4)  # another stage
    with pytest.raises(InjectedFault):
        plan.check("send", 5, 1)
