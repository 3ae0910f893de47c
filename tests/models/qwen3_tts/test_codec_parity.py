"""Codec parity with the official qwen-tts 0.1.1 code (one official process for the module): a tiny random speech
tokenizer from our maker, loaded by official `Qwen3TTSTokenizer.from_pretrained`; decoder, streaming decode, encoder
codes, and the speaker x-vector, all fp32 on CPU."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.models.qwen3_tts.conftest import run_official
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import (
    load_codec_decoder,
    load_codec_encoder,
    make_random_speech_tokenizer,
)
from vllm_voxserve.models.qwen3_tts.codec.init import init_speaker_encoder_weights
from vllm_voxserve.models.qwen3_tts.codec.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, decode_chunk

pytestmark = pytest.mark.parity

OFFICIAL_SIDE = Path(__file__).parent / "official" / "codec_side.py"
NUM_FRAMES = 90  # past the 72-frame window, below official decode's 300-frame chunking
SPEAKER_CONFIG = {"enc_dim": 64, "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16,
                  "enc_se_channels": 16, "sample_rate": 24000}


def _relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def case(official_python, tmp_path_factory):
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("codec_parity")
    tokenizer_dir = root / "speech_tokenizer"
    make_random_speech_tokenizer(tokenizer_dir, "tiny", seed=11)
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 2048, (2, NUM_FRAMES, 16), generator=g)
    t = torch.arange(int(2.3 * 24000)) / 24000  # not a whole number of frames
    wav = (0.3 * torch.sin(2 * torch.pi * 180 * t) * torch.sin(2 * torch.pi * 2 * t)
           + 0.05 * torch.randn(t.shape, generator=g)).float()
    speaker_encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(SPEAKER_CONFIG)).eval()
    init_speaker_encoder_weights(speaker_encoder, seed=4)
    save_file({f"speaker_encoder.{k}": v.contiguous() for k, v in speaker_encoder.state_dict().items()},
              str(root / "speaker_encoder.safetensors"))
    np.savez(root / "inputs.npz", codes=codes.numpy(), wav=wav.numpy())
    spec = {"speech_tokenizer": str(tokenizer_dir), "inputs": str(root / "inputs.npz"),
            "outputs": str(root / "outputs.npz"),
            "speaker_encoder": {"config": SPEAKER_CONFIG, "weights": str(root / "speaker_encoder.safetensors")}}
    (root / "spec.json").write_text(json.dumps(spec))
    run_official(official_python, OFFICIAL_SIDE, str(root / "spec.json"))
    official = dict(np.load(root / "outputs.npz"))
    return {"dir": tokenizer_dir, "codes": codes, "wav": wav, "speaker_encoder": speaker_encoder,
            "official": official}


def test_full_decode_matches_official(case):
    decoder = load_codec_decoder(case["dir"])
    with torch.no_grad():
        ours = decoder(case["codes"].transpose(1, 2))[:, 0].numpy()
    ref = case["official"]["decoded"]
    assert ours.shape == ref.shape == (2, NUM_FRAMES * 1920)
    assert np.sqrt((ref**2).mean()) > 0.05  # the checkpoint is not silent
    assert _relative_error(ours, ref) <= 1e-4
    assert _relative_error(ours, case["official"]["decoded_forward"][:, 0]) <= 1e-4


def test_streaming_decode_matches_official(case):
    decoder = load_codec_decoder(case["dir"])
    pool = CodecStatePool(decoder.config, num_slots=4, dtype=torch.float32, device="cpu")
    slots = torch.tensor([3, 1])
    pool.reset(slots)
    pieces, start = [], 0
    with torch.no_grad():
        for size in (1, 8, 32, 49):
            pieces.append(decode_chunk(decoder, case["codes"][:, start : start + size], slots, pool))
            start += size
    assert start == NUM_FRAMES
    assert _relative_error(torch.cat(pieces, dim=1).numpy(), case["official"]["decoded"]) <= 1e-4


def test_encoder_codes_equal_official(case):
    encoder = load_codec_encoder(case["dir"])
    ours = encoder.encode(case["wav"], 24000).numpy()
    ref = case["official"]["encoded"]
    assert ours.shape == ref.shape == (-(-case["wav"].numel() // 1920), 16)
    assert len(np.unique(ref)) > 16  # not a degenerate encoder
    np.testing.assert_array_equal(ours, ref)


def test_speaker_xvector_matches_official(case):
    ours = case["speaker_encoder"].extract_xvector(case["wav"], 24000).numpy()
    ref = case["official"]["xvector"]
    assert ours.shape == ref.shape == (SPEAKER_CONFIG["enc_dim"],)
    assert _relative_error(ours, ref) <= 1e-4
