"""Official side of the codec parity tests: runs in the qwen-tts 0.1.1 environment (scripts/install_parity.sh).

    python codec_side.py SPEC.json

SPEC: {"speech_tokenizer": DIR (made by our maker), "inputs": NPZ, "outputs": NPZ,
       "speaker_encoder": {"config": {...speaker_encoder_config...}, "weights": SAFETENSORS} (optional)}.
Inputs: `codes` [B,T,16] int64 and `wav` [N] float32 (24 kHz). Outputs, all fp32 on CPU with nothing of ours imported:
- `decoded` [B, 1920*T]: `Qwen3TTSTokenizer.from_pretrained(DIR).model.decode(codes)` (the official decode API);
- `decoded_forward` [B, 1, 1920*T]: the decoder's plain forward;
- `encoded` [F,16]: `Qwen3TTSTokenizer.encode(wav, sr=24000)` (feature extractor + Mimi encoder, first 16 codes);
- `xvector` [enc_dim]: `Qwen3TTSForConditionalGeneration.extract_speaker_embedding(wav, 24000)` with the official
  speaker encoder built from the given config and weights.
"""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import torch
import transformers  # noqa: F401  (before the stubs, as qwen_tts imports it first)


import audio_stubs  # noqa: E402  (beside this script)


audio_stubs.install()
from qwen_tts import Qwen3TTSTokenizer  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import (  # noqa: E402
    Qwen3TTSForConditionalGeneration,
    Qwen3TTSSpeakerEncoder,
)
from safetensors.torch import load_file  # noqa: E402


def _check_loaded_exactly(model: torch.nn.Module, weights_path: str) -> None:
    """from_pretrained only warns about missing keys; fail instead, so the layout is proven."""
    file = load_file(weights_path)
    state = model.state_dict()
    missing = sorted(set(state) - set(file))
    unexpected = sorted(set(file) - set(state))
    changed = [k for k in state if k in file and not torch.equal(state[k].float(), file[k].float())]
    if missing or unexpected or changed:
        raise SystemExit(f"checkpoint mismatch: missing {missing[:5]} extra {unexpected[:5]} changed {changed[:5]}")


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    torch.backends.cuda.matmul.allow_tf32 = False
    inputs = np.load(spec["inputs"])
    out: dict[str, np.ndarray] = {}

    tokenizer = Qwen3TTSTokenizer.from_pretrained(spec["speech_tokenizer"], dtype=torch.float32)
    model = tokenizer.model.float().eval()
    _check_loaded_exactly(model, f"{spec['speech_tokenizer']}/model.safetensors")
    with torch.no_grad():
        codes = torch.from_numpy(inputs["codes"]).long()
        decoded = model.decode(codes, return_dict=True).audio_values
        out["decoded"] = torch.stack(decoded).numpy()
        out["decoded_forward"] = model.decoder(codes.transpose(1, 2)).numpy()
        wav = inputs["wav"].astype(np.float32)
        encoded = tokenizer.encode(wav, sr=24000, return_dict=True).audio_codes
        out["encoded"] = encoded[0].numpy()

    if spec.get("speaker_encoder"):
        cfg = Qwen3TTSSpeakerEncoderConfig(**spec["speaker_encoder"]["config"])
        speaker_encoder = Qwen3TTSSpeakerEncoder(cfg).eval()
        weights = load_file(spec["speaker_encoder"]["weights"])
        speaker_encoder.load_state_dict(
            {k.removeprefix("speaker_encoder."): v for k, v in weights.items()}, strict=True
        )
        # The method only reads .speaker_encoder, .device and .dtype of the full model.
        holder = types.SimpleNamespace(speaker_encoder=speaker_encoder, device=torch.device("cpu"), dtype=torch.float32)
        xvector = Qwen3TTSForConditionalGeneration.extract_speaker_embedding(holder, wav, 24000)
        out["xvector"] = xvector.float().numpy()

    np.savez(spec["outputs"], **out)


if __name__ == "__main__":
    main(sys.argv[1])
