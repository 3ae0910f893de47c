"""Load the talker side of an official-layout Qwen3-TTS checkpoint (config.json, generation_config.json,
model.safetensors or shards listed in model.safetensors.index.json) into our modules, by parameter name."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from torch import nn

from .configuration import Qwen3TTSConfig
from .prompt import PromptTables, TalkerGenerationRules
from .talker import Talker


class Qwen3TTSTalkerSide(nn.Module):
    """`talker.*` (talker + code predictor) and, for Base, `speaker_encoder.*` when that module is available."""

    def __init__(self, config: Qwen3TTSConfig, speaker_encoder: nn.Module | None = None):
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker_config)
        self.speaker_encoder = speaker_encoder
        self.tables = PromptTables.from_config(config)
        self.rules = TalkerGenerationRules.from_tables(self.tables)
        self.generation_config: dict = {}


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: model.safetensors, or the shards of model.safetensors.index.json."""
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(path / shard)))
        return state
    single = path / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    return load_file(str(single))


def load_talker_side(path: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                     with_speaker_encoder: bool = True) -> Qwen3TTSTalkerSide:
    """Build the modules from config.json and load every `talker.*` tensor (all must be present and used).

    `speaker_encoder.*` is loaded for Base checkpoints when `codec/speaker_encoder.py` exists; codec and other
    tensors are left to their own loaders."""
    path = Path(path)
    config = Qwen3TTSConfig.from_pretrained(path)
    state = read_state_dict(path)
    encoder = None
    if with_speaker_encoder and config.tts_model_type == "base" and any(k.startswith("speaker_encoder.") for k in state):
        encoder = _build_speaker_encoder(config)
    model = Qwen3TTSTalkerSide(config, encoder)
    wanted = {k: v for k, v in state.items()
              if k.startswith("talker.") or (encoder is not None and k.startswith("speaker_encoder."))}
    result = model.load_state_dict(wanted, strict=False)
    missing = [k for k in result.missing_keys if k.startswith("talker.") or encoder is not None]
    if missing or result.unexpected_keys:
        raise ValueError(f"checkpoint {path} does not match the config: missing {missing[:8]}, "
                         f"unexpected {result.unexpected_keys[:8]}")
    gen = path / "generation_config.json"
    model.generation_config = json.loads(gen.read_text()) if gen.exists() else {}
    return model.to(device=device, dtype=dtype).eval()


def _build_speaker_encoder(config: Qwen3TTSConfig) -> nn.Module | None:
    try:
        module = importlib.import_module("vllm_voxserve.models.qwen3_tts.codec.speaker_encoder")
    except ModuleNotFoundError:
        return None
    return build_speaker_encoder(module, config)


def build_speaker_encoder(module, config, seed: int | None = None):
    """`SpeakerEncoder` from our config (its own config class reads the official dict); seeded default init."""
    encoder_config = module.SpeakerEncoderConfig.from_dict(config.speaker_encoder_config.to_dict())
    if seed is None:
        return module.SpeakerEncoder(encoder_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        return module.SpeakerEncoder(encoder_config)
