"""Make a randomly initialised Qwen3-TTS checkpoint in exactly the official layout (no hub access here).

    python -m vllm_voxserve.models.qwen3_tts.checkpoint --out DIR --size {tiny,0.6b,1.7b}
        --kind {custom_voice,voice_design,base} [--dtype bfloat16|float32] [--seed N]

Writes config.json (the released values for 0.6b / 1.7b), generation_config.json, model.safetensors (official
names), plus, when the other parts of the package are present, speech_tokenizer/ and the text tokenizer files.
Weights are scaled so outputs are not degenerate (notes §6.3 items 8-9): linear weights N(0, 1/fan_in) so each
layer keeps its input scale, output heads 3x that so logits are peaked rather than near-uniform, embeddings N(0, 1),
norm weights 1 + N(0, 0.1), biases N(0, 0.1). Deterministic per seed.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import math
from pathlib import Path

import torch

LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
DIALECTS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECTS = {s: False for s in SPEAKERS} | {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                     "subtalker_top_k": 50, "max_new_tokens": 8192}
SIZES = ("tiny", "0.6b", "1.7b")
KINDS = ("custom_voice", "voice_design", "base")

# per size: talker (hidden, intermediate, layers, heads, kv heads, head_dim, text_hidden),
#           code predictor (hidden, intermediate, layers, heads, kv heads, head_dim)
_SHAPES = {
    "1.7b": ((2048, 6144, 28, 16, 8, 128, 2048), (1024, 3072, 5, 16, 8, 128)),
    "0.6b": ((1024, 3072, 28, 16, 8, 128, 2048), (1024, 3072, 5, 16, 8, 128)),
    # vLLM's CPU attention needs head_dim 64 or 128
    "tiny": ((128, 256, 2, 2, 1, 64, 64), (64, 128, 2, 2, 1, 64)),
}
_MODEL_SIZE_FIELD = {"1.7b": "1b7", "0.6b": "0b6", "tiny": "tiny"}


def official_config(size: str, kind: str) -> dict:
    """config.json as released (0.6b / 1.7b; the 0.6B has no VoiceDesign) or its tiny analogue."""
    if size not in SIZES or kind not in KINDS:
        raise ValueError(f"size must be one of {SIZES} and kind one of {KINDS}, got {size!r}, {kind!r}")
    if size == "0.6b" and kind == "voice_design":
        raise ValueError("there is no 0.6B VoiceDesign model; use --size 1.7b or tiny")
    (h, inter, layers, heads, kv, hd, text_h), (ch, cinter, clayers, cheads, ckv, chd) = _SHAPES[size]
    custom = kind == "custom_voice"
    talker = {
        "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "vocab_size": 3072, "text_vocab_size": 151936, "text_hidden_size": text_h, "num_code_groups": 16,
        "hidden_act": "silu", "position_id_per_seconds": 13, "codec_bos_id": 2149, "codec_eos_token_id": 2150,
        "codec_pad_id": 2148, "codec_think_id": 2154, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157, "codec_language_id": LANGUAGES | (DIALECTS if custom else {}),
        "spk_id": dict(SPEAKERS) if custom else {}, "spk_is_dialect": dict(SPEAKER_DIALECTS) if custom else {},
        "code_predictor_config": {
            "hidden_size": ch, "intermediate_size": cinter, "num_hidden_layers": clayers,
            "num_attention_heads": cheads, "num_key_value_heads": ckv, "head_dim": chd,
            "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "vocab_size": 2048,
            "num_code_groups": 16, "layer_types": ["full_attention"] * clayers, "hidden_act": "silu",
            "attention_bias": False},
        "attention_bias": False,
    }
    config = {"model_type": "qwen3_tts", "tts_model_type": kind, "tts_model_size": _MODEL_SIZE_FIELD[size],
              "tokenizer_type": "qwen3_tts_tokenizer_12hz", "im_start_token_id": 151644, "im_end_token_id": 151645,
              "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
              "assistant_token_id": 77091, "talker_config": talker}
    if kind == "base":
        config["speaker_encoder_config"] = {"enc_dim": h, "sample_rate": 24000}
    return copy.deepcopy(config)


def randomize_(module: torch.nn.Module, generator: torch.Generator, head_gain: float = 3.0) -> None:
    """In-place init by parameter name (see the module docstring); parameters are visited in name order. The draws
    are made on the generator's device (a CPU generator gives the same weights on any machine)."""
    for name, param in sorted(module.named_parameters(), key=lambda item: item[0]):
        with torch.no_grad():
            draw = torch.randn(param.shape, generator=generator, device=generator.device, dtype=torch.float32)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                param.copy_(1 + 0.1 * draw)
            elif name.endswith(".bias"):
                param.copy_(0.1 * draw)
            elif "embedding" in name:
                param.copy_(draw)
            else:
                gain = head_gain if ("codec_head" in name or "lm_head" in name) else 1.0
                param.copy_(gain / math.sqrt(param.shape[-1]) * draw)


def make_checkpoint(out: str | Path, size: str, kind: str, dtype: str = "bfloat16", seed: int = 0,
                    with_codec_and_tokenizer: bool = True, device: str = "cpu") -> Path:
    """Write the checkpoint folder; returns its path. `with_codec_and_tokenizer=False` writes only the talker side
    (config.json, generation_config.json, model.safetensors), e.g. for tests that need nothing else. `device`: where
    the talker's random weights are drawn (cuda: seconds instead of a minute for the 1.7B, other numbers than CPU)."""
    from safetensors.torch import save_file

    from .configuration import Qwen3TTSConfig
    from .loader import Qwen3TTSTalkerSide

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config_dict = official_config(size, kind)
    config = Qwen3TTSConfig.from_dict(config_dict)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # build in the target dtype: the 1.7B would need 7.7 GB in fp32
    try:
        speaker = _speaker_encoder(config, seed) if kind == "base" else None
        with torch.device(device):
            model = Qwen3TTSTalkerSide(config, speaker_encoder=None)
        model.speaker_encoder = speaker
    finally:
        torch.set_default_dtype(previous)
    randomize_(model.talker, torch.Generator(device).manual_seed(seed))
    state = {k: v.detach().to("cpu", torch_dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    # save_pretrained writes these two keys into every hub config.json; vLLM picks the model class by the first
    saved = {"architectures": ["Qwen3TTSForConditionalGeneration"], **config_dict, "torch_dtype": dtype}
    (out / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    if with_codec_and_tokenizer:
        _call_if_present("vllm_voxserve.models.qwen3_tts.codec.checkpoint", "make_random_speech_tokenizer",
                         out / "speech_tokenizer", "tiny" if size == "tiny" else "full", seed, torch_dtype)
        _call_if_present("vllm_voxserve.models.qwen3_tts.tokenizer", "write_tokenizer_files", out)
    return out


def _speaker_encoder(config, seed: int):
    """The codec engineer's ECAPA speaker encoder, default-initialised under a seed, or None if not there yet."""
    try:
        module = importlib.import_module("vllm_voxserve.models.qwen3_tts.codec.speaker_encoder")
    except ModuleNotFoundError:
        return None
    from .loader import build_speaker_encoder

    return build_speaker_encoder(module, config, seed)


def _call_if_present(module_name: str, function: str, *args) -> bool:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        return False
    fn = getattr(module, function, None)
    if fn is None:
        return False
    fn(*args)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", choices=SIZES, required=True)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to draw the random weights (e.g. cuda)")
    args = parser.parse_args(argv)
    print(make_checkpoint(args.out, args.size, args.kind, args.dtype, args.seed, device=args.device))


if __name__ == "__main__":
    main()
