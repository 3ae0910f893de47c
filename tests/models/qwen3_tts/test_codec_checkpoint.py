"""The random speech-tokenizer maker and the config reader (tiny sizes; the official loader is in the parity test)."""
import json

import pytest
import torch
from safetensors.torch import load_file

from vllm_voxserve.models.qwen3_tts.codec.checkpoint import (
    load_codec_decoder,
    load_codec_encoder,
    make_random_speech_tokenizer,
    speech_tokenizer_config,
)
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig, SpeechTokenizerConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(2)
    out = tmp_path_factory.mktemp("tiny") / "speech_tokenizer"
    make_random_speech_tokenizer(out, "tiny", seed=0)
    return out


def test_maker_writes_the_official_layout(tiny_dir):
    assert {p.name for p in tiny_dir.iterdir()} == {"config.json", "model.safetensors", "preprocessor_config.json"}
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert config["decoder_config"]["head_dim"] and config["decoder_config"]["codebook_dim"]
    assert json.loads((tiny_dir / "preprocessor_config.json").read_text())["sampling_rate"] == 24000
    keys = load_file(str(tiny_dir / "model.safetensors")).keys()
    assert {k.split(".")[0] for k in keys} == {"decoder", "encoder"}
    assert "decoder.quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum" in keys
    assert "encoder.quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum" in keys


def test_tiny_keeps_1920_samples_per_frame_at_24k(tiny_dir):
    config = SpeechTokenizerConfig.from_pretrained(tiny_dir)
    assert config.decoder.samples_per_frame == config.decode_upsample_rate == 1920
    assert config.output_sample_rate == 24000
    decoder = load_codec_decoder(tiny_dir)
    with torch.no_grad():
        wav = decoder(torch.randint(0, 2048, (1, 16, 3)))
    assert wav.shape == (1, 1, 3 * 1920)


def test_maker_is_seeded(tiny_dir, tmp_path):
    make_random_speech_tokenizer(tmp_path / "same", "tiny", seed=0)
    make_random_speech_tokenizer(tmp_path / "other", "tiny", seed=1)
    ref = load_file(str(tiny_dir / "model.safetensors"))
    same = load_file(str(tmp_path / "same" / "model.safetensors"))
    other = load_file(str(tmp_path / "other" / "model.safetensors"))
    name = "decoder.pre_conv.conv.weight"
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    assert not torch.equal(ref[name], other[name])


def test_bf16_checkpoint_loads_into_any_dtype(tmp_path):
    make_random_speech_tokenizer(tmp_path, "tiny", seed=0, dtype=torch.bfloat16)
    assert load_file(str(tmp_path / "model.safetensors"))["decoder.pre_conv.conv.weight"].dtype == torch.bfloat16
    decoder = load_codec_decoder(tmp_path, dtype=torch.float32)
    assert next(decoder.parameters()).dtype == torch.float32
    assert load_codec_encoder(tmp_path, dtype=torch.bfloat16).encoder.layers[0].conv.weight.dtype == torch.bfloat16


def test_full_config_has_the_real_codec_shapes():
    config = speech_tokenizer_config("full")
    with torch.device("meta"):
        decoder = CodecDecoder(config.decoder)
    assert sum(p.numel() for p in decoder.parameters()) == 114_323_137  # notes §5
    assert config.decoder.sliding_window == 72 and config.decoder.head_dim == 64


def test_config_validation():
    with pytest.raises(ValueError):
        speech_tokenizer_config("medium")
    d = speech_tokenizer_config("tiny").to_dict()
    with pytest.raises(ValueError, match="model_type"):
        SpeechTokenizerConfig.from_dict({**d, "model_type": "mimi"})
    no_head_dim = {k: v for k, v in d["decoder_config"].items() if k != "head_dim"}
    with pytest.raises(ValueError, match="head_dim"):
        SpeechTokenizerConfig.from_dict({**d, "decoder_config": no_head_dim})
    with pytest.raises(ValueError):
        SpeechTokenizerConfig.from_dict({**d, "decode_upsample_rate": 960})
    with pytest.raises(ValueError):
        CodecDecoderConfig(num_attention_heads=16, num_key_value_heads=5)
    assert SpeechTokenizerConfig.from_dict(d) == speech_tokenizer_config("tiny")


def test_speaker_encoder_weights_round_trip_through_a_main_checkpoint(tmp_path):
    from safetensors.torch import save_file

    from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_speaker_encoder, random_speaker_encoder_weights

    se_config = {"enc_dim": 32, "enc_channels": [16, 16, 16, 16, 48], "enc_attention_channels": 8,
                 "enc_se_channels": 8, "sample_rate": 24000}
    weights = random_speaker_encoder_weights(se_config, seed=2)
    assert all(k.startswith("speaker_encoder.") for k in weights) and "speaker_encoder.fc.weight" in weights
    save_file({**weights, "talker.model.norm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"speaker_encoder_config": se_config}))
    module = load_speaker_encoder(tmp_path)
    assert torch.equal(module.fc.weight, weights["speaker_encoder.fc.weight"])
    (tmp_path / "config.json").write_text(json.dumps({"tts_model_type": "custom_voice"}))
    with pytest.raises(ValueError, match="speaker_encoder_config"):
        load_speaker_encoder(tmp_path)
