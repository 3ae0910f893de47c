"""Official side of test_official_checkpoint_parity.py: runs in the qwen-tts 0.1.1 environment (scripts/install_parity.sh).

    python saved_checkpoint_side.py SPEC.json

SPEC: {"checkpoints": {KEY: {"source": DIR, "out": DIR}}, "reference_wav": NPY (24 kHz float32), "scenarios": [...],
       "out": NPZ}; with no scenarios only step 1 runs.
1. Writes each checkpoint with the official classes' own `save_pretrained` (transformers 4.57.3): the model built
   from SOURCE's config.json and weights into OUT, the speech tokenizer loaded from SOURCE/speech_tokenizer (model
   and feature extractor) into OUT/speech_tokenizer. OUT may already hold the text tokenizer files; they are kept.
2. Loads OUT back (after working around one official reload bug, see `_accept_the_saved_speaker_encoder_config`)
   through the official wrapper (`Qwen3TTSModel.from_pretrained`: processor, model, speech tokenizer,
   generation config, all from disk) and runs each scenario greedily through its `generate_custom_voice` /
   `generate_voice_design` / `generate_voice_clone`, fp32, eager attention, TF32 off.
Outputs per scenario: `<name>/codes` [F,16] (what the wrapper's `model.generate` returned) and `<name>/wav` [N]
(the wrapper's audio: the speech tokenizer's decode, minus the reference part for voice cloning).
"""
from __future__ import annotations

import json
import sys

import numpy as np
import torch
import transformers  # noqa: F401  (before the stubs, as qwen_tts imports it first)

import audio_stubs  # noqa: E402  (beside this script)

audio_stubs.install()
from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer  # noqa: E402
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

GREEDY = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=1.05, top_k=50, top_p=1.0,
              temperature=0.9, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9)


def save_official(source: str, out: str) -> None:
    with open(f"{source}/config.json") as f:
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**json.load(f))).eval()
    result = model.load_state_dict(load_file(f"{source}/model.safetensors"), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    model.save_pretrained(out)
    codec = Qwen3TTSTokenizer.from_pretrained(f"{source}/speech_tokenizer", dtype=torch.float32)
    codec.model.save_pretrained(f"{out}/speech_tokenizer")
    codec.feature_extractor.save_pretrained(f"{out}/speech_tokenizer")


def _accept_the_saved_speaker_encoder_config() -> None:
    """The official code cannot read back what its own save_pretrained writes: `speaker_encoder_config` gets a
    `model_type` key that `Qwen3TTSSpeakerEncoderConfig.__init__` (no **kwargs) refuses. Drop it on the way in, on
    this side only (the project reads the folders unchanged)."""
    init = Qwen3TTSSpeakerEncoderConfig.__init__

    def accepting_init(self, *args, model_type=None, **kwargs):
        init(self, *args, **kwargs)

    Qwen3TTSSpeakerEncoderConfig.__init__ = accepting_init


def load_wrapper(path: str):
    tts = Qwen3TTSModel.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    for module in tts.model.modules():  # eager attention everywhere (the sub-configs are separate objects)
        if hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            module.config._attn_implementation = "eager"
    tts.model.float().eval()
    captured = []
    generate = tts.model.generate

    def capturing_generate(**kwargs):
        codes, hidden = generate(**kwargs)
        captured.append([c.clone() for c in codes])
        return codes, hidden

    tts.model.generate = capturing_generate
    return tts, captured


@torch.no_grad()
def main(spec_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with open(spec_path) as f:
        spec = json.load(f)
    for paths in spec["checkpoints"].values():
        save_official(paths["source"], paths["out"])
    if not spec["scenarios"]:
        return
    _accept_the_saved_speaker_encoder_config()
    reference = np.load(spec["reference_wav"]).astype(np.float32)
    out: dict[str, np.ndarray] = {}
    wrappers = {key: load_wrapper(paths["out"]) for key, paths in spec["checkpoints"].items()}
    for sc in spec["scenarios"]:
        tts, captured = wrappers[sc["checkpoint"]]
        common = dict(text=sc["text"], language=sc["language"], non_streaming_mode=sc["non_streaming"],
                      max_new_tokens=sc["max_new_tokens"], **GREEDY)
        if sc["kind"] == "custom_voice":
            wavs, rate = tts.generate_custom_voice(speaker=sc["speaker"], instruct=sc.get("instruct"), **common)
        elif sc["kind"] == "voice_design":
            wavs, rate = tts.generate_voice_design(instruct=sc["instruct"], **common)
        else:
            wavs, rate = tts.generate_voice_clone(ref_audio=(reference, 24000), ref_text=sc.get("ref_text"),
                                                  x_vector_only_mode=sc["x_vector_only"], **common)
        assert rate == 24000, rate
        out[f"{sc['name']}/codes"] = captured.pop()[0].numpy()
        out[f"{sc['name']}/wav"] = np.asarray(wavs[0], dtype=np.float32)
    np.savez(spec["out"], **out)


if __name__ == "__main__":
    main(sys.argv[1])
