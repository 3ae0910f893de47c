"""Official side of the talker parity tests: runs in the qwen-tts 0.1.1 environment (scripts/install_parity.sh).

    python talker_side.py SPEC.json

SPEC names the checkpoints (made by our maker), the scenarios, an input .npz (x-vectors, reference codes, extra
teacher-forcing rows, code-predictor inputs) and the output .npz. The official classes are built from our
config.json and loaded with our safetensors; nothing of ours is imported. fp32, TF32 off, eager attention.
Outputs per scenario: `<name>/prefill` [L,H] and `<name>/trailing` [N,H] as handed to `talker.generate`, and
`<name>/codes` [F,16] from the official greedy `generate()` and `<name>/sampled_codes` from a seeded sampled one,
when the scenario asks for them.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import torch
import transformers  # noqa: F401  (must come before the stubs: qwen_tts imports it first too)


import audio_stubs  # noqa: E402  (beside this script)


audio_stubs.install()
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

ROLE = [151644, 77091, 198]
TAIL = [151645, 198, 151644, 77091, 198]


class _Captured(Exception):
    pass


def load_official(path: str) -> Qwen3TTSForConditionalGeneration:
    with open(f"{path}/config.json") as f:
        cfg = Qwen3TTSConfig(**json.load(f))
    model = Qwen3TTSForConditionalGeneration(cfg).eval()
    for module in model.modules():  # eager attention everywhere (the sub-configs are separate objects)
        if hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            module.config._attn_implementation = "eager"
    result = model.load_state_dict(load_file(f"{path}/model.safetensors"), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("speaker_encoder.")]
    if missing or result.unexpected_keys:
        raise SystemExit(f"state dict mismatch: missing {missing[:5]} unexpected {result.unexpected_keys[:5]}")
    return model.float()


def generate_kwargs(sc: dict, inputs: dict) -> dict:
    name = sc["name"]
    kwargs = {"input_ids": [torch.tensor([ROLE + sc["text_ids"] + TAIL])], "languages": [sc["language"]],
              "non_streaming_mode": sc["non_streaming"]}
    if sc.get("speaker"):
        kwargs["speakers"] = [sc["speaker"]]
    if sc.get("instruct_ids"):
        kwargs["instruct_ids"] = [torch.tensor([sc["instruct_ids"]])]
    if sc.get("voice_clone"):
        icl = not sc["x_vector_only"]
        kwargs["voice_clone_prompt"] = {
            "ref_spk_embedding": [torch.from_numpy(inputs[f"{name}/x_vector"])],
            "x_vector_only_mode": [sc["x_vector_only"]], "icl_mode": [icl],
            "ref_code": [torch.from_numpy(inputs[f"{name}/ref_codes"]).long()] if icl else None,
        }
        if icl:
            kwargs["ref_ids"] = [torch.tensor([ROLE + sc["ref_text_ids"] + [151645, 198]])]
    return kwargs


def capture_prefill(model, kwargs: dict):
    seen = {}

    def fake_generate(**kw):
        seen.update(kw)
        raise _Captured

    model.talker.generate = fake_generate
    try:
        model.generate(**kwargs, max_new_tokens=4, do_sample=False, subtalker_dosample=False)
    except _Captured:
        pass
    finally:
        del model.talker.generate
    return seen["inputs_embeds"][0].numpy(), seen["trailing_text_hidden"][0].numpy()


@torch.no_grad()
def main(spec_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with open(spec_path) as f:
        spec = json.load(f)
    inputs = dict(np.load(spec["inputs"]))
    models = {key: load_official(path) for key, path in spec["checkpoints"].items()}
    out: dict[str, np.ndarray] = {}
    for sc in spec["scenarios"]:
        model, name = models[sc["checkpoint"]], sc["name"]
        kwargs = generate_kwargs(sc, inputs)
        out[f"{name}/prefill"], out[f"{name}/trailing"] = capture_prefill(model, kwargs)
        if sc.get("greedy_tokens"):
            codes, _ = model.generate(**kwargs, max_new_tokens=sc["greedy_tokens"], do_sample=False,
                                      subtalker_dosample=False)
            out[f"{name}/codes"] = codes[0].numpy()
        if sc.get("sampled"):  # same seed and draw order on our side: 15 code-predictor draws, then 1 talker draw
            torch.manual_seed(sc["sampled"]["seed"])
            params = {k: v for k, v in sc["sampled"].items() if k != "seed"}
            codes, _ = model.generate(**kwargs, do_sample=True, subtalker_dosample=True, **params)
            out[f"{name}/sampled_codes"] = codes[0].numpy()
    tf = spec["teacher_forcing"]
    talker = models[tf["checkpoint"]].talker
    embeds = np.concatenate([out[f"{tf['scenario']}/prefill"], inputs["tf/extra_rows"]])[None]
    res = talker(inputs_embeds=torch.from_numpy(embeds), attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long))
    out["tf/logits"] = res.logits[0].numpy()
    hidden, codes = torch.from_numpy(inputs["cp/hidden"]), torch.from_numpy(inputs["cp/codes"]).long()
    out["cp/logits"] = talker.forward_sub_talker_finetune(codes, hidden)[0].numpy()
    cp_in = torch.cat([hidden[:, None], talker.get_input_embeddings()(codes[:, :1])], dim=1)
    greedy = talker.code_predictor.generate(inputs_embeds=cp_in, max_new_tokens=talker.config.num_code_groups - 1,
                                            do_sample=False)
    out["cp/greedy_codes"] = greedy.numpy() if torch.is_tensor(greedy) else greedy.sequences.numpy()
    np.savez(spec["out"], **out)


if __name__ == "__main__":
    main(sys.argv[1])
