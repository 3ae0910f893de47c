"""Parity of our talker side with the official qwen-tts 0.1.1 code on the same random tiny weights.

One official process per module (tests/models/qwen3_tts/official/talker_side.py) computes everything; the tests
compare: prefill + trailing embeddings of every prompt mode, teacher-forced talker logits, code-predictor logits
per group (through our incremental static-KV path), and greedy codes token for token. fp32, TF32 off."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.qwen3_tts.conftest import run_official
from vllm_voxserve.models.qwen3_tts.checkpoint import make_checkpoint
from vllm_voxserve.models.qwen3_tts.loader import load_talker_side
from vllm_voxserve.models.qwen3_tts.prompt import SpeechPrompt, build_plan
from vllm_voxserve.models.qwen3_tts.reference import SamplingConfig, generate
from vllm_voxserve.models.qwen3_tts.talker import embed_plan_with

pytestmark = pytest.mark.parity

OFFICIAL = Path(__file__).parent / "official" / "talker_side.py"
TEXT = [9707, 11, 1879, 0, 1096, 374, 264, 1273, 13]  # "Hello, world! This is a test."
INSTRUCT = [151644, 872, 198, 41, 6647, 11, 6301, 7743, 13, 151645, 198]  # a full <|im_start|>user ... block
REF_TEXT = [40, 1079, 264]
REL_TOL = 1e-4

SCENARIOS = [
    dict(name="cv_stream", checkpoint="cv", language="english", speaker="ryan", non_streaming=False, greedy_tokens=8),
    dict(name="cv_nonstream", checkpoint="cv", language="english", speaker="ryan", non_streaming=True,
         sampled=dict(seed=11, max_new_tokens=6, temperature=0.9, top_k=50, top_p=0.9, subtalker_temperature=1.1,
                      subtalker_top_k=20, subtalker_top_p=0.8, repetition_penalty=1.05)),
    dict(name="cv_dialect_auto", checkpoint="cv", language="auto", speaker="dylan", non_streaming=True),
    dict(name="cv_dialect_chinese_stream", checkpoint="cv", language="chinese", speaker="eric", non_streaming=False),
    dict(name="cv_instruct", checkpoint="cv", language="english", speaker="vivian", non_streaming=True,
         instruct_ids=INSTRUCT),
    dict(name="vd_stream", checkpoint="vd", language="english", non_streaming=False, instruct_ids=INSTRUCT),
    dict(name="vd_nonstream", checkpoint="vd", language="auto", non_streaming=True, instruct_ids=INSTRUCT,
         greedy_tokens=6),
    dict(name="base_xvec", checkpoint="base", language="english", non_streaming=False, voice_clone=True,
         x_vector_only=True),
    dict(name="base_xvec_nonstream", checkpoint="base", language="auto", non_streaming=True, voice_clone=True,
         x_vector_only=True),
    # text longer than the reference: text spills into the trailing stream
    dict(name="base_icl_stream_long_text", checkpoint="base", language="english", non_streaming=False,
         voice_clone=True, x_vector_only=False, ref_text_ids=REF_TEXT, ref_frames=5, greedy_tokens=6),
    # reference longer than the text: text padded with tts_pad inside the prefill
    dict(name="base_icl_stream_long_ref", checkpoint="base", language="english", non_streaming=False,
         voice_clone=True, x_vector_only=False, ref_text_ids=REF_TEXT, ref_frames=20),
    dict(name="base_icl_nonstream", checkpoint="base", language="german", non_streaming=True, voice_clone=True,
         x_vector_only=False, ref_text_ids=REF_TEXT, ref_frames=7),
]
KINDS = {"cv": "custom_voice", "vd": "voice_design", "base": "base"}


def rel_err(ours, theirs, what: str = "") -> float:
    """max |ours - theirs| / max |theirs| (printed: `pytest -rP` shows the measured values)."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    err = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))
    print(f"{what}: relative error {err:.2e}")
    return err


@pytest.fixture(scope="module")
def parity(tmp_path_factory, official_python):
    torch.backends.cuda.matmul.allow_tf32 = False
    root = tmp_path_factory.mktemp("talker_parity")
    checkpoints = {key: str(make_checkpoint(root / key, "tiny", kind, "float32", seed=7 + i,
                                            with_codec_and_tokenizer=False))
                   for i, (key, kind) in enumerate(KINDS.items())}
    models = {key: load_talker_side(path, dtype=torch.float32) for key, path in checkpoints.items()}
    hidden = models["cv"].talker.config.hidden_size
    rng = np.random.default_rng(0)
    inputs = {"tf/extra_rows": rng.standard_normal((4, hidden)).astype(np.float32),
              "cp/hidden": rng.standard_normal((3, hidden)).astype(np.float32),
              "cp/codes": rng.integers(0, 2048, (3, 16)).astype(np.int64)}
    for sc in SCENARIOS:
        if sc.get("voice_clone"):
            inputs[f"{sc['name']}/x_vector"] = rng.standard_normal(hidden).astype(np.float32)
            inputs[f"{sc['name']}/ref_codes"] = rng.integers(0, 2048, (sc.get("ref_frames", 1), 16)).astype(np.int64)
    np.savez(root / "inputs.npz", **inputs)
    spec = {"checkpoints": checkpoints, "inputs": str(root / "inputs.npz"), "out": str(root / "official.npz"),
            "teacher_forcing": {"checkpoint": "cv", "scenario": "cv_stream"},
            "scenarios": [dict(sc, text_ids=TEXT) for sc in SCENARIOS]}
    (root / "spec.json").write_text(json.dumps(spec))
    run_official(official_python, OFFICIAL, str(root / "spec.json"), timeout=600)
    return models, inputs, dict(np.load(root / "official.npz"))


def _plan_and_inputs(models, inputs, sc):
    model = models[sc["checkpoint"]]
    prompt = SpeechPrompt(text_ids=tuple(TEXT), language=sc["language"], speaker=sc.get("speaker"),
                          instruct_ids=tuple(sc.get("instruct_ids", ())), x_vector_only=sc.get("x_vector_only", False),
                          ref_text_ids=tuple(sc.get("ref_text_ids", ())), num_ref_frames=sc.get("ref_frames", 0),
                          non_streaming=sc["non_streaming"])
    x_vector = ref_codes = None
    if sc.get("voice_clone"):
        x_vector = torch.from_numpy(inputs[f"{sc['name']}/x_vector"])
        ref_codes = torch.from_numpy(inputs[f"{sc['name']}/ref_codes"])
    return model, build_plan(model.tables, prompt), x_vector, ref_codes


@pytest.mark.parametrize("name", [sc["name"] for sc in SCENARIOS])
def test_prefill_and_trailing_embeddings(parity, name):
    models, inputs, official = parity
    sc = next(s for s in SCENARIOS if s["name"] == name)
    model, plan, x_vector, ref_codes = _plan_and_inputs(models, inputs, sc)
    with torch.no_grad():
        prefill, trailing = embed_plan_with(model.talker, plan, x_vector, ref_codes)
    assert rel_err(prefill, official[f"{name}/prefill"], f"{name} prefill") <= REL_TOL
    assert rel_err(trailing, official[f"{name}/trailing"], f"{name} trailing") <= REL_TOL


def test_teacher_forced_talker_logits(parity):
    models, inputs, official = parity
    sc = SCENARIOS[0]
    model, plan, _, _ = _plan_and_inputs(models, inputs, sc)
    with torch.no_grad():
        prefill, _ = embed_plan_with(model.talker, plan)
        embeds = torch.cat([prefill, torch.from_numpy(inputs["tf/extra_rows"])])[None]
        logits = model.talker.codec_head(model.talker.model(embeds))[0]
    assert rel_err(logits, official["tf/logits"], "teacher-forced talker logits") <= REL_TOL


def test_code_predictor_logits_per_group(parity):
    models, inputs, official = parity
    cp = models["cv"].talker.code_predictor
    hidden, codes = torch.from_numpy(inputs["cp/hidden"]), torch.from_numpy(inputs["cp/codes"])
    with torch.no_grad():
        _, incremental = cp.run_frame(hidden, codes[:, 0], forced_codes=codes[:, 1:])
        one_pass = cp.teacher_forced_logits(hidden, codes)
        greedy = cp.predict_frame(hidden, codes[:, 0])
    for group in range(15):
        assert rel_err(incremental[:, group], official["cp/logits"][:, group], f"cp group {group + 1}") <= REL_TOL
    assert rel_err(one_pass, official["cp/logits"], "cp one causal pass") <= REL_TOL
    np.testing.assert_array_equal(greedy.numpy(), official["cp/greedy_codes"])


@pytest.mark.parametrize("name", [sc["name"] for sc in SCENARIOS if sc.get("greedy_tokens")])
def test_greedy_codes_identical(parity, name):
    models, inputs, official = parity
    sc = next(s for s in SCENARIOS if s["name"] == name)
    model, plan, x_vector, ref_codes = _plan_and_inputs(models, inputs, sc)
    sampling = SamplingConfig(do_sample=False, subtalker_dosample=False, max_new_tokens=sc["greedy_tokens"])
    out = generate(model.talker, plan, model.rules, sampling, x_vector, ref_codes)
    expected = official[f"{name}/codes"]
    assert expected.shape[0] >= 3, "too few frames to compare"
    print(f"{name}: {expected.shape[0]} frames, hit EOS: {out.hit_eos}")
    np.testing.assert_array_equal(out.codes.numpy(), expected)


@pytest.mark.parametrize("name", [sc["name"] for sc in SCENARIOS if sc.get("sampled")])
def test_seeded_sampled_codes_identical(parity, name):
    """Same global seed, same draw order, same warpers: the sampled codes match the official ones exactly."""
    models, inputs, official = parity
    sc = next(s for s in SCENARIOS if s["name"] == name)
    model, plan, x_vector, ref_codes = _plan_and_inputs(models, inputs, sc)
    params = {k: v for k, v in sc["sampled"].items() if k != "seed"}
    torch.manual_seed(sc["sampled"]["seed"])
    out = generate(model.talker, plan, model.rules, SamplingConfig(**params), x_vector, ref_codes)
    np.testing.assert_array_equal(out.codes.numpy(), official[f"{name}/sampled_codes"])
