"""Config of the Qwen3-TTS 12 Hz speech tokenizer (`speech_tokenizer/config.json`, model_type
`qwen3_tts_tokenizer_12hz`), read from the official JSON layout unchanged.

The decoder part is a frozen dataclass (the serving path needs it). The encoder part is a Mimi config: we keep its
dict as-is (it is only handed to the encoder) and read the few fields we use."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"


@dataclass(frozen=True)
class CodecDecoderConfig:
    latent_dim: int = 1024
    codebook_dim: int = 512  # the RVQ entries are codebook_dim // 2 wide
    codebook_size: int = 2048
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    hidden_act: str = "silu"
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    sliding_window: int = 72
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    semantic_codebook_size: int = 4096  # in the official config, unused by the official decoder
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    vector_quantization_hidden_dimension: int = 512
    attention_bias: bool = False

    def __post_init__(self):
        object.__setattr__(self, "upsample_rates", tuple(int(r) for r in self.upsample_rates))
        object.__setattr__(self, "upsampling_ratios", tuple(int(r) for r in self.upsampling_ratios))
        if self.hidden_act != "silu":
            raise ValueError(f"decoder hidden_act must be 'silu', got {self.hidden_act!r}")
        if self.codebook_dim % 2:
            raise ValueError(f"codebook_dim must be even (entries are codebook_dim // 2), got {self.codebook_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.num_quantizers <= self.num_semantic_quantizers or self.num_semantic_quantizers != 1:
            raise ValueError("the split RVQ needs exactly 1 semantic quantizer and at least one acoustic one")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError(f"decoder_dim {self.decoder_dim} must halve {len(self.upsample_rates)} times")
        if any(r < 1 for r in self.upsample_rates + self.upsampling_ratios):
            raise ValueError("upsample rates must be positive")

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CodecDecoderConfig":
        if "head_dim" not in d or "codebook_dim" not in d:
            # The official code has no default for codebook_dim and silently uses hidden/heads for head_dim.
            raise ValueError("decoder_config must set head_dim and codebook_dim explicitly")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["upsample_rates"] = list(self.upsample_rates)
        d["upsampling_ratios"] = list(self.upsampling_ratios)
        return d


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: CodecDecoderConfig = field(default_factory=CodecDecoderConfig)
    encoder_config: dict[str, Any] = field(default_factory=dict)  # a transformers MimiConfig, kept verbatim
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    def __post_init__(self):
        if self.decode_upsample_rate != self.decoder.samples_per_frame:
            raise ValueError(
                f"decode_upsample_rate {self.decode_upsample_rate} != decoder upsampling "
                f"{self.decoder.samples_per_frame}"
            )
        if self.encoder_valid_num_quantizers != self.decoder.num_quantizers:
            raise ValueError("encoder_valid_num_quantizers must equal the decoder's num_quantizers")
        if self.encoder_config:
            enc_q = int(self.encoder_config.get("num_quantizers", 32))
            if enc_q < self.encoder_valid_num_quantizers:
                raise ValueError(f"the encoder has {enc_q} quantizers, fewer than {self.encoder_valid_num_quantizers}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpeechTokenizerConfig":
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"expected model_type {MODEL_TYPE!r}, got {d.get('model_type')!r}")
        return cls(
            decoder=CodecDecoderConfig.from_dict(d.get("decoder_config") or {}),
            encoder_config=dict(d.get("encoder_config") or {}),
            encoder_valid_num_quantizers=int(d.get("encoder_valid_num_quantizers", 16)),
            input_sample_rate=int(d.get("input_sample_rate", 24000)),
            output_sample_rate=int(d.get("output_sample_rate", 24000)),
            decode_upsample_rate=int(d.get("decode_upsample_rate", 1920)),
            encode_downsample_rate=int(d.get("encode_downsample_rate", 1920)),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "SpeechTokenizerConfig":
        """`path` is a `speech_tokenizer/` folder or its config.json."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(json.loads(path.read_text()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3TTSTokenizerV2Model"],
            "model_type": MODEL_TYPE,
            "encoder_valid_num_quantizers": self.encoder_valid_num_quantizers,
            "input_sample_rate": self.input_sample_rate,
            "output_sample_rate": self.output_sample_rate,
            "decode_upsample_rate": self.decode_upsample_rate,
            "encode_downsample_rate": self.encode_downsample_rate,
            "encoder_config": dict(self.encoder_config),
            "decoder_config": self.decoder.to_dict(),
        }
