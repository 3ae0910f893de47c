"""Random-weight speech tokenizers in the official `speech_tokenizer/` layout, and loaders for our modules.

`make_random_speech_tokenizer(out_dir, "tiny" | "full", seed, dtype)` writes into `out_dir` (the `speech_tokenizer`
folder itself) what official `Qwen3TTSTokenizer.from_pretrained` reads: config.json, model.safetensors
(`decoder.*` + `encoder.*`) and preprocessor_config.json. "full" has the real 12 Hz codec shapes; "tiny" keeps the
structure and the 1920 samples per 24 kHz frame with much smaller widths, for CPU tests."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .configuration import CodecDecoderConfig, SpeechTokenizerConfig
from .decoder import CodecDecoder
from .encoder import CodecEncoder, MimiEncoderConfig
from .init import init_codec_decoder_weights, init_codec_encoder_weights, init_speaker_encoder_weights
from .speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig

WEIGHTS_FILE = "model.safetensors"
SPEAKER_PREFIX = "speaker_encoder."

FULL_ENCODER_CONFIG = {
    "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3,
    "num_residual_layers": 1, "compress": 2, "upsampling_ratios": [8, 6, 5, 4], "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
    "intermediate_size": 2048, "hidden_act": "gelu", "norm_eps": 1e-05, "layer_scale_initial_scale": 0.01,
    "rope_theta": 10000, "max_position_embeddings": 8000, "sliding_window": 250, "num_quantizers": 32,
    "num_semantic_quantizers": 1, "codebook_size": 2048, "codebook_dim": 256,
    "vector_quantization_hidden_dimension": 256, "pad_mode": "constant", "use_causal_conv": True,
    "sampling_rate": 24000, "frame_rate": 12.5,
}
TINY_ENCODER_CONFIG = dict(
    FULL_ENCODER_CONFIG, num_filters=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=8, intermediate_size=64, codebook_dim=16, vector_quantization_hidden_dimension=16,
    upsample_groups=32,  # MimiModel builds its (unused here) upsampler with this many groups; default 512 > width
)
TINY_DECODER_CONFIG = CodecDecoderConfig(
    latent_dim=64, codebook_dim=32, decoder_dim=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, head_dim=8,
)
PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": 24000,
    "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True, "chunk_length_s": None,
    "overlap": None,
}


def speech_tokenizer_config(size: str) -> SpeechTokenizerConfig:
    if size == "full":
        return SpeechTokenizerConfig(decoder=CodecDecoderConfig(), encoder_config=dict(FULL_ENCODER_CONFIG))
    if size == "tiny":
        return SpeechTokenizerConfig(decoder=TINY_DECODER_CONFIG, encoder_config=dict(TINY_ENCODER_CONFIG))
    raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")


def build_codec_encoder(config: SpeechTokenizerConfig) -> CodecEncoder:
    return CodecEncoder(MimiEncoderConfig.from_dict(config.encoder_config), config.encoder_valid_num_quantizers,
                        config.encode_downsample_rate)


def make_random_speech_tokenizer(out_dir: str | Path, size: str, seed: int,
                                 dtype: torch.dtype = torch.float32) -> SpeechTokenizerConfig:
    """Write a random, audible speech tokenizer into `out_dir` (created if needed); returns its config."""
    config = speech_tokenizer_config(size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    decoder = CodecDecoder(config.decoder).eval()
    init_codec_decoder_weights(decoder, seed)
    encoder = build_codec_encoder(config).eval()
    init_codec_encoder_weights(encoder, seed + 1)
    tensors = {f"decoder.{k}": v for k, v in decoder.state_dict().items()}
    tensors.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config_dict = dict(config.to_dict(), torch_dtype=str(dtype).removeprefix("torch."))
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    return config


def _load_part(speech_tokenizer_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    weights = load_file(str(Path(speech_tokenizer_dir) / WEIGHTS_FILE))
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def load_codec_decoder(speech_tokenizer_dir: str | Path, dtype: torch.dtype = torch.float32,
                       device="cpu") -> CodecDecoder:
    """The decoder of a `speech_tokenizer/` folder, in eval mode."""
    config = SpeechTokenizerConfig.from_pretrained(speech_tokenizer_dir)
    decoder = CodecDecoder(config.decoder)
    decoder.load_state_dict(_load_part(Path(speech_tokenizer_dir), "decoder."), strict=True)
    return decoder.to(device=device, dtype=dtype).eval()


def load_codec_encoder(speech_tokenizer_dir: str | Path, dtype: torch.dtype = torch.float32,
                       device="cpu") -> CodecEncoder:
    """The encoder (reference clip -> codes) of a `speech_tokenizer/` folder, in eval mode."""
    config = SpeechTokenizerConfig.from_pretrained(speech_tokenizer_dir)
    encoder = build_codec_encoder(config)
    encoder.load_state_dict(_load_part(Path(speech_tokenizer_dir), "encoder."), strict=True)
    return encoder.to(device=device, dtype=dtype).eval()


def random_speaker_encoder_weights(speaker_encoder_config: dict, seed: int,
                                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """`speaker_encoder.*` tensors of a Base model's main checkpoint, for the main config's `speaker_encoder_config`."""
    module = SpeakerEncoder(SpeakerEncoderConfig.from_dict(speaker_encoder_config))
    init_speaker_encoder_weights(module, seed)
    return {SPEAKER_PREFIX + k: v.detach().to(dtype).contiguous() for k, v in module.state_dict().items()}


def _main_checkpoint_tensors(model_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors under `prefix` from model.safetensors or the shards named by model.safetensors.index.json."""
    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [WEIGHTS_FILE]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        shard = load_file(str(model_dir / name))
        tensors.update({k[len(prefix):]: v for k, v in shard.items() if k.startswith(prefix)})
    return tensors


def load_speaker_encoder(model_dir: str | Path, dtype: torch.dtype = torch.float32, device="cpu") -> SpeakerEncoder:
    """The speaker encoder of a Base model folder (main config.json + checkpoint), in eval mode."""
    model_dir = Path(model_dir)
    main_config = json.loads((model_dir / "config.json").read_text())
    if not main_config.get("speaker_encoder_config"):
        raise ValueError(f"{model_dir} has no speaker_encoder_config (only Base models have a speaker encoder)")
    module = SpeakerEncoder(SpeakerEncoderConfig.from_dict(main_config["speaker_encoder_config"]))
    module.load_state_dict(_main_checkpoint_tensors(model_dir, SPEAKER_PREFIX), strict=True)
    return module.to(device=device, dtype=dtype).eval()
