"""Config of the Qwen3-TTS talker side (`config.json`, model_type `qwen3_tts`), read from the official layout unchanged.

transformers 5.x renames `rope_scaling` to `rope_parameters` and adds its own keys on save; the official code (and
the official `config.json`) use the 4.x names. So each class keeps the official keys it was given, in order, and
`to_dict()` writes exactly those back: `Qwen3TTSConfig.from_dict(d).to_dict() == d` for an official `d`.

Keys we do not read are kept as given, whatever transformers makes of them: the official `save_pretrained` (4.57)
writes every `PretrainedConfig` default into the sub-configs (`max_length`, `do_sample`, `bad_words_ids`,
`use_cache`, ...), and transformers 5.x drops such generation keys in `PretrainedConfig.__init__`, so an attribute
lookup by key would fail. Their raw values are what `to_dict()` writes back.
`rope_parameters` is still set (plain 1-D RoPE: with the identical position streams of TTS, the talker's M-RoPE is
exactly 1-D RoPE), for code that reads the 5.x name.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

MODEL_TYPE = "qwen3_tts"
MODEL_KINDS = ("custom_voice", "voice_design", "base")

# transformers keys that are not part of the official layout and are never written back
_HF_BOOKKEEPING = ("transformers_version", "_name_or_path", "name_or_path", "architectures", "dtype",
                   "torch_dtype")


class _OfficialLayoutConfig(PretrainedConfig):
    """Keeps the official keys (`_official_keys`) and serialises exactly them, sub-configs recursively."""

    _sub_config_keys: tuple[str, ...] = ()

    # Defaults, for keys a config.json lacks, are the released 12 Hz values (the official classes' defaults are
    # those of an older layout: codec ids 4196.., 32 code groups).

    def _init_base(self, kwargs: dict[str, Any]) -> None:
        """`PretrainedConfig.__init__` with the keys we do not read; keeps their raw values for `to_dict()`.
        Keys that would hit a read-only attribute of this transformers version are kept but not set."""
        object.__setattr__(self, "_given_extras", copy.deepcopy(kwargs))
        settable = {k: v for k, v in kwargs.items() if not _read_only(type(self), k)}
        # this class's own __init__ (transformers 5.x generates one for it, without running its validators on a
        # half-built config), not PretrainedConfig's
        _OfficialLayoutConfig.__init__(self, **settable)
        object.__setattr__(self, "_extras_frozen", True)

    def __setattr__(self, key: str, value: Any) -> None:
        if self.__dict__.get("_extras_frozen"):  # set after loading: the new value is the one to write back
            self.__dict__["_given_extras"].pop(key, None)
        super().__setattr__(key, value)

    def _remember(self, given: dict[str, Any]) -> None:
        object.__setattr__(self, "_official_keys", [k for k in given if k not in _HF_BOOKKEEPING])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        extras = self.__dict__.get("_given_extras", {})
        for key in self._official_keys:
            if key == "rope_scaling":
                value = self._official_rope_scaling
            elif key in extras:
                value = extras[key]
            else:
                value = getattr(self, key)
            if isinstance(value, PretrainedConfig):
                value = value.to_dict()
            out[key] = copy.deepcopy(value)
        return out

    def to_diff_dict(self) -> dict[str, Any]:
        return self.to_dict()

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def _set_rope(self, rope_theta: float, rope_scaling: dict | None) -> None:
        object.__setattr__(self, "_official_rope_scaling", copy.deepcopy(rope_scaling))
        self.rope_theta = rope_theta
        self.rope_parameters = {"rope_type": "default", "rope_theta": float(rope_theta)}

    @property
    def rope_scaling(self):  # the official (4.x) name and value, as read
        return self._official_rope_scaling


def _read_only(cls: type, key: str) -> bool:
    attr = getattr(cls, key, None)
    return isinstance(attr, property) and attr.fset is None


def _check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


class Qwen3TTSSpeakerEncoderConfig(_OfficialLayoutConfig):
    model_type = "qwen3_tts_speaker_encoder"

    def __init__(self, mel_dim=128, enc_dim=1024, enc_channels=(512, 512, 512, 512, 1536),
                 enc_kernel_sizes=(5, 3, 3, 3, 1), enc_dilations=(1, 2, 3, 4, 1), enc_attention_channels=128,
                 enc_res2net_scale=8, enc_se_channels=128, sample_rate=24000, **kwargs):
        order = list(kwargs.pop("_key_order", ()))
        self._init_base(kwargs)
        self.mel_dim, self.enc_dim, self.sample_rate = mel_dim, enc_dim, sample_rate
        self.enc_channels, self.enc_kernel_sizes = list(enc_channels), list(enc_kernel_sizes)
        self.enc_dilations, self.enc_attention_channels = list(enc_dilations), enc_attention_channels
        self.enc_res2net_scale, self.enc_se_channels = enc_res2net_scale, enc_se_channels
        self._remember(dict.fromkeys(order or _default_order(self, kwargs)))
        _check_positive("speaker_encoder_config", enc_dim=enc_dim, sample_rate=sample_rate)


class Qwen3TTSCodePredictorConfig(_OfficialLayoutConfig):
    model_type = "qwen3_tts_talker_code_predictor"

    def __init__(self, vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                 max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000, rope_scaling=None,
                 attention_bias=False, num_code_groups=16, layer_types=None, **kwargs):
        order = list(kwargs.pop("_key_order", ()))
        self._init_base(kwargs)
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.head_dim, self.hidden_act = num_key_value_heads, head_dim, hidden_act
        self.max_position_embeddings, self.rms_norm_eps = max_position_embeddings, rms_norm_eps
        self.attention_bias, self.num_code_groups = attention_bias, num_code_groups
        self.layer_types = list(layer_types) if layer_types is not None else ["full_attention"] * num_hidden_layers
        self._set_rope(rope_theta, rope_scaling)
        self._remember(dict.fromkeys(order or _default_order(self, kwargs)))
        _validate_transformer("code_predictor_config", self)


class Qwen3TTSTalkerConfig(_OfficialLayoutConfig):
    model_type = "qwen3_tts_talker"

    def __init__(self, code_predictor_config=None, vocab_size=3072, hidden_size=1024, intermediate_size=2048,
                 num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=2, head_dim=None,
                 hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000,
                 rope_scaling=None, attention_bias=False, num_code_groups=16, text_hidden_size=2048,
                 text_vocab_size=151936, codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
                 codec_think_bos_id=2156, codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
                 spk_id=None, spk_is_dialect=None, codec_language_id=None, **kwargs):
        order = list(kwargs.pop("_key_order", ()))
        self._init_base(kwargs)
        if isinstance(code_predictor_config, dict):
            code_predictor_config = Qwen3TTSCodePredictorConfig(
                **code_predictor_config, _key_order=list(code_predictor_config))
        elif code_predictor_config is None:
            code_predictor_config = Qwen3TTSCodePredictorConfig()
        self.code_predictor_config = code_predictor_config
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.hidden_act = num_key_value_heads, hidden_act
        # the official fallback for a missing head_dim is hidden/heads (wrong for 0.6B, notes §6.3.1)
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings, self.rms_norm_eps = max_position_embeddings, rms_norm_eps
        self.attention_bias, self.num_code_groups = attention_bias, num_code_groups
        self.text_hidden_size, self.text_vocab_size = text_hidden_size, text_vocab_size
        self.codec_eos_token_id, self.codec_pad_id, self.codec_bos_id = codec_eos_token_id, codec_pad_id, codec_bos_id
        self.codec_think_id, self.codec_nothink_id = codec_think_id, codec_nothink_id
        self.codec_think_bos_id, self.codec_think_eos_id = codec_think_bos_id, codec_think_eos_id
        self.spk_id = dict(spk_id or {})
        self.spk_is_dialect = dict(spk_is_dialect or {})
        self.codec_language_id = dict(codec_language_id or {})
        self._set_rope(rope_theta, rope_scaling)
        self._remember(dict.fromkeys(order or _default_order(self, kwargs)))
        _validate_transformer("talker_config", self)
        if code_predictor_config.num_code_groups != num_code_groups:
            raise ValueError(f"talker and code predictor num_code_groups differ: {num_code_groups} vs "
                             f"{code_predictor_config.num_code_groups}")
        if not (0 < codec_eos_token_id < vocab_size):
            raise ValueError(f"codec_eos_token_id {codec_eos_token_id} is outside the codec vocabulary {vocab_size}")
        unknown = {s: d for s, d in self.spk_is_dialect.items() if d and d not in self.codec_language_id}
        if unknown:
            raise ValueError(f"spk_is_dialect names dialects missing from codec_language_id: {unknown}")


class Qwen3TTSConfig(_OfficialLayoutConfig):
    model_type = MODEL_TYPE

    def __init__(self, talker_config=None, speaker_encoder_config=None, tokenizer_type=None, tts_model_size=None,
                 tts_model_type=None, im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                 tts_bos_token_id=151672, tts_eos_token_id=151673, assistant_token_id=77091, **kwargs):
        order = list(kwargs.pop("_key_order", ()))
        self._init_base(kwargs)
        if isinstance(talker_config, dict):
            talker_config = Qwen3TTSTalkerConfig(**talker_config, _key_order=list(talker_config))
        elif talker_config is None:
            talker_config = Qwen3TTSTalkerConfig()
        self.talker_config = talker_config
        self._has_speaker_encoder_key = speaker_encoder_config is not None
        if isinstance(speaker_encoder_config, dict):
            speaker_encoder_config = Qwen3TTSSpeakerEncoderConfig(
                **speaker_encoder_config, _key_order=list(speaker_encoder_config))
        self.speaker_encoder_config = speaker_encoder_config or Qwen3TTSSpeakerEncoderConfig()
        self.tokenizer_type, self.tts_model_size, self.tts_model_type = tokenizer_type, tts_model_size, tts_model_type
        self.im_start_token_id, self.im_end_token_id = im_start_token_id, im_end_token_id
        self.tts_pad_token_id, self.tts_bos_token_id = tts_pad_token_id, tts_bos_token_id
        self.tts_eos_token_id, self.assistant_token_id = tts_eos_token_id, assistant_token_id
        keys = order or _default_order(self, kwargs)
        if not self._has_speaker_encoder_key:
            keys = [k for k in keys if k != "speaker_encoder_config"]
        self._remember(dict.fromkeys(keys))
        if tts_model_type is not None and tts_model_type not in MODEL_KINDS:
            raise ValueError(f"tts_model_type must be one of {MODEL_KINDS}, got {tts_model_type!r}")
        if tts_model_type == "base" and self.speaker_encoder_config.enc_dim != talker_config.hidden_size:
            raise ValueError(f"speaker_encoder_config.enc_dim ({self.speaker_encoder_config.enc_dim}) must equal the "
                             f"talker hidden_size ({talker_config.hidden_size}) for Base models")

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """As `PretrainedConfig.from_dict`: kwargs naming attributes override them, the rest are returned unused
        when `return_unused_kwargs=True`; the official keys of `config_dict` are what `to_dict()` writes back."""
        return_unused = kwargs.pop("return_unused_kwargs", False)
        name_or_path = kwargs.pop("name_or_path", None)
        config = cls(**config_dict, _key_order=list(config_dict))
        unused = {}
        for key, value in kwargs.items():
            if key in ("attn_implementation", "dtype", "torch_dtype") or hasattr(config, key):
                setattr(config, "_attn_implementation" if key == "attn_implementation" else key, value)
            else:
                unused[key] = value
        if name_or_path is not None:
            config._name_or_path = str(name_or_path)
        return (config, unused) if return_unused else config

    @classmethod
    def from_json_file(cls, path: str | Path) -> "Qwen3TTSConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> "Qwen3TTSConfig":
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()), **kwargs)

    def get_text_config(self, decoder=None, encoder=None):  # what vLLM sizes the KV cache from
        return self.talker_config


def _default_order(config: PretrainedConfig, extra: dict[str, Any]) -> list[str]:
    """Key order when a config is built from arguments rather than read: the __init__ parameters, then extras."""
    import inspect

    names = [p for p in inspect.signature(type(config).__init__).parameters if p not in ("self", "kwargs")]
    return names + [k for k in extra if k not in names and k not in _HF_BOOKKEEPING]


def _validate_transformer(owner: str, c: PretrainedConfig) -> None:
    _check_positive(owner, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                    num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                    head_dim=c.head_dim, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size)
    if c.num_attention_heads % c.num_key_value_heads:
        raise ValueError(f"{owner}: num_attention_heads ({c.num_attention_heads}) must be a multiple of "
                         f"num_key_value_heads ({c.num_key_value_heads})")
    if c.head_dim % 2:
        raise ValueError(f"{owner}: head_dim must be even for RoPE, got {c.head_dim}")
    if c.hidden_act != "silu":
        raise ValueError(f"{owner}: hidden_act must be 'silu', got {c.hidden_act!r}")
