"""Reference-clip encoders (codec encoder and speaker encoder): shapes and input validation (tiny, CPU).
Numerical agreement with the official code is in test_codec_parity.py."""
import numpy as np
import pytest
import torch

from vllm_voxserve.models.qwen3_tts.codec.checkpoint import build_codec_encoder, speech_tokenizer_config
from vllm_voxserve.models.qwen3_tts.codec.init import init_codec_encoder_weights, init_speaker_encoder_weights
from vllm_voxserve.models.qwen3_tts.codec.speaker_encoder import (
    SpeakerEncoder,
    SpeakerEncoderConfig,
    log_mel_spectrogram,
    mel_filterbank,
)


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(2)
    enc = build_codec_encoder(speech_tokenizer_config("tiny")).eval()
    init_codec_encoder_weights(enc, seed=0)
    return enc


@pytest.fixture(scope="module")
def speaker_encoder():
    module = SpeakerEncoder(SpeakerEncoderConfig(enc_dim=48, enc_channels=(16, 16, 16, 16, 48),
                                                 enc_attention_channels=8, enc_se_channels=8)).eval()
    init_speaker_encoder_weights(module, seed=0)
    return module


def _clip(n: int) -> torch.Tensor:
    return 0.2 * torch.randn(n, generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("num_samples, frames", [(1920, 1), (1921, 2), (3 * 1920 + 7, 4), (24000, 13)])
def test_encode_gives_ceil_len_over_1920_frames_of_16_codes(encoder, num_samples, frames):
    codes = encoder.encode(_clip(num_samples), 24000)
    assert codes.shape == (frames, 16) and codes.dtype == torch.long
    assert 0 <= codes.min() and codes.max() < 2048


def test_encode_validates_its_input(encoder):
    with pytest.raises(ValueError, match="24000 Hz"):
        encoder.encode(_clip(4000), 16000)
    with pytest.raises(ValueError, match="empty"):
        encoder.encode(torch.zeros(0), 24000)
    with pytest.raises(ValueError, match="mono"):
        encoder.encode(torch.zeros(2, 4000), 24000)


def test_xvector_shape_and_determinism(speaker_encoder):
    wav = _clip(24000)
    x = speaker_encoder.extract_xvector(wav, 24000)
    assert x.shape == (48,) and torch.isfinite(x).all()
    assert torch.equal(x, speaker_encoder.extract_xvector(wav.numpy(), 24000))
    assert not torch.allclose(x, speaker_encoder.extract_xvector(_clip(24001), 24000))


def test_xvector_validates_its_input(speaker_encoder):
    with pytest.raises(ValueError, match="24000 Hz"):
        speaker_encoder.extract_xvector(_clip(24000), 44100)
    with pytest.raises(ValueError, match="empty"):
        speaker_encoder.extract_xvector(torch.zeros(0), 24000)
    with pytest.raises(ValueError, match="too short"):
        speaker_encoder.extract_xvector(_clip(300), 24000)
    with pytest.raises(ValueError, match="mono"):
        speaker_encoder.extract_xvector(torch.zeros(1, 24000), 24000)


def test_mel_front_end_shape_and_filters():
    mels = log_mel_spectrogram(_clip(24000)[None])
    assert mels.shape == (1, 24000 // 256, 128)  # (N + 2*384 - 1024) // 256 + 1 frames
    fb = mel_filterbank().numpy()
    assert fb.shape == (128, 513)
    freqs = np.linspace(0, 12000, 513)
    assert fb[:, freqs > 12000].sum() == 0 and (fb.sum(axis=1) > 0).all()  # fmax 12 kHz, no empty filter


def test_speaker_encoder_config_validation():
    with pytest.raises(ValueError):
        SpeakerEncoderConfig(enc_channels=(16, 16, 16, 16, 40))  # aggregation width != concatenated width
    with pytest.raises(ValueError):
        SpeakerEncoderConfig(enc_channels=(16, 16), enc_kernel_sizes=(5, 3), enc_dilations=(1, 1))
    with pytest.raises(ValueError):
        SpeakerEncoderConfig(mel_dim=80)
