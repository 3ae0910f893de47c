"""Checkpoints written by the official qwen-tts 0.1.1 code's own `save_pretrained` (transformers 4.57.3) serve
unchanged: every file of the folder as that code wrote it, plus the text tokenizer files the hub repos ship.

One official process (tests/models/qwen3_tts/official/saved_checkpoint_side.py) writes a tiny CustomVoice,
VoiceDesign and Base checkpoint (model and speech tokenizer) and runs the official wrapper on them as reloaded from
disk, greedily. Here the same folders go through the loaders and modules the server uses, one of them by hub repo id
from an offline hub cache: the codes must equal the official ones, and the 16-bit PCM the official audio's within
2 LSB, for both text modes. fp32, TF32 off."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch

from tests.hub_cache import lay_out_hub_cache
from tests.models.qwen3_tts.conftest import run_official
from vllm_voxserve.entrypoints.audio_format import pcm16_bytes
from vllm_voxserve.models.qwen3_tts.checkpoint import make_checkpoint
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_codec_decoder, load_codec_encoder, load_speaker_encoder
from vllm_voxserve.models.qwen3_tts.codec.state import CodecStatePool, decode_chunk
from vllm_voxserve.models.qwen3_tts.loader import load_talker_side
from vllm_voxserve.models.qwen3_tts.model_files import resolve_and_check
from vllm_voxserve.models.qwen3_tts.prompt import SpeechPrompt, build_plan
from vllm_voxserve.models.qwen3_tts.reference import SamplingConfig, generate
from vllm_voxserve.models.qwen3_tts.tokenizer import (
    REF_TEXT_SLICE,
    encode_instruct,
    encode_ref_text,
    load_text_tokenizer,
    target_text_ids,
    write_tokenizer_files,
)

pytestmark = pytest.mark.parity

OFFICIAL = Path(__file__).parent / "official" / "saved_checkpoint_side.py"
KINDS = {"cv": "custom_voice", "vd": "voice_design", "base": "base"}
HUB_REPO = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"  # the cv checkpoint is read from a hub cache under this id
TEXT = "Hello, world! This is a test."
INSTRUCT = "A calm, low voice."
REF_TEXT = "This is the reference."
MAX_NEW_TOKENS = 10
CHUNK_FRAMES = 4  # our codec decodes frame chunks with carried state, as the server does

SCENARIOS = [dict(name=f"{key}_{'nonstream' if non_streaming else 'stream'}", checkpoint=key, kind=KINDS[key],
                  non_streaming=non_streaming, text=TEXT, language="english", max_new_tokens=MAX_NEW_TOKENS,
                  **extra)
             for key, extra in (("cv", dict(speaker="ryan")), ("vd", dict(instruct=INSTRUCT)),
                                ("base", dict(ref_text=REF_TEXT, x_vector_only=False)))
             for non_streaming in (False, True)]
SCENARIOS += [dict(SCENARIOS[0], name="cv_instruct", instruct=INSTRUCT),
              dict(SCENARIOS[4], name="base_xvector_only", ref_text=None, x_vector_only=True)]


def _reference_clip() -> np.ndarray:
    g = torch.Generator().manual_seed(5)
    t = torch.arange(int(1.7 * 24000)) / 24000  # not a whole number of frames
    wav = 0.3 * torch.sin(2 * torch.pi * 160 * t) * torch.sin(2 * torch.pi * 3 * t) + 0.05 * torch.randn(t.shape,
                                                                                                           generator=g)
    return wav.float().numpy()


@pytest.fixture(scope="module")
def official(tmp_path_factory, official_python):
    torch.backends.cuda.matmul.allow_tf32 = False
    root = tmp_path_factory.mktemp("official_saved")
    checkpoints = {}
    for i, (key, kind) in enumerate(KINDS.items()):
        source = make_checkpoint(root / f"{key}_weights", "tiny", kind, "float32", seed=21 + i)
        out = write_tokenizer_files(root / key)  # the hub repos ship these beside what save_pretrained writes
        checkpoints[key] = {"source": str(source), "out": str(out)}
    np.save(root / "reference.npy", _reference_clip())
    spec = {"checkpoints": checkpoints, "reference_wav": str(root / "reference.npy"), "scenarios": SCENARIOS,
            "out": str(root / "official.npz")}
    (root / "spec.json").write_text(json.dumps(spec))
    run_official(official_python, OFFICIAL, str(root / "spec.json"), timeout=900)
    cache = root / "hub"
    lay_out_hub_cache(Path(checkpoints["cv"]["out"]), cache, HUB_REPO)
    dirs = {key: Path(paths["out"]) for key, paths in checkpoints.items()}
    return dirs, cache, dict(np.load(root / "official.npz"))


@pytest.fixture
def model_dirs(official, monkeypatch):
    dirs, cache, _ = official
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return {"cv": resolve_and_check(HUB_REPO), "vd": resolve_and_check(dirs["vd"]),
            "base": resolve_and_check(dirs["base"])}


@functools.lru_cache(maxsize=None)
def _served_parts(model_dir: Path):
    """What the API server and the worker load from a checkpoint folder (float32, CPU)."""
    talker_side = load_talker_side(model_dir, dtype=torch.float32)
    base = talker_side.tables.model_type == "base"
    return {"tokenizer": load_text_tokenizer(model_dir), "model": talker_side,
            "decoder": load_codec_decoder(model_dir / "speech_tokenizer", torch.float32),
            "codec_encoder": load_codec_encoder(model_dir / "speech_tokenizer", torch.float32) if base else None,
            "speaker_encoder": load_speaker_encoder(model_dir, torch.float32) if base else None}


def _serve(model_dir: Path, sc: dict) -> tuple[np.ndarray, np.ndarray]:
    """Codes [F,16] and int16 PCM for one scenario, through the served path's pieces in-process."""
    parts = _served_parts(model_dir)
    tok, model = parts["tokenizer"], parts["model"]
    x_vector = ref_codes = None
    ref_text_ids: tuple[int, ...] = ()
    if sc["kind"] == "base":
        clip = torch.from_numpy(_reference_clip())
        x_vector = parts["speaker_encoder"].extract_xvector(clip)
        if not sc["x_vector_only"]:
            ref_codes = parts["codec_encoder"].encode(clip, 24000)
            ref_text_ids = tuple(encode_ref_text(tok, sc["ref_text"])[REF_TEXT_SLICE])
    prompt = SpeechPrompt(text_ids=tuple(target_text_ids(tok, sc["text"])), language=sc["language"],
                          speaker=sc.get("speaker"),
                          instruct_ids=tuple(encode_instruct(tok, sc["instruct"])) if sc.get("instruct") else (),
                          x_vector_only=sc.get("x_vector_only", False), ref_text_ids=ref_text_ids,
                          num_ref_frames=0 if ref_codes is None else ref_codes.shape[0],
                          non_streaming=sc["non_streaming"])
    sampling = SamplingConfig(do_sample=False, subtalker_dosample=False, max_new_tokens=sc["max_new_tokens"])
    codes = generate(model.talker, build_plan(model.tables, prompt), model.rules, sampling, x_vector, ref_codes).codes
    decoder = parts["decoder"]
    pool = CodecStatePool(decoder.config, num_slots=1, dtype=torch.float32, device="cpu")
    slot = torch.tensor([0])
    pool.reset(slot)
    with torch.no_grad():
        if ref_codes is not None:  # ICL continues the reference: its frames go through the codec first, unheard
            decode_chunk(decoder, ref_codes[None], slot, pool)
        pieces = [decode_chunk(decoder, codes[None, start:start + CHUNK_FRAMES], slot, pool)
                  for start in range(0, codes.shape[0], CHUNK_FRAMES)]
    audio = torch.cat(pieces, dim=1)[0].numpy()
    return codes.numpy(), np.frombuffer(pcm16_bytes(audio), dtype="<i2")


def test_the_folders_are_what_the_official_save_pretrained_writes(official):
    dirs, _, _ = official
    for path in dirs.values():
        config = json.loads((path / "config.json").read_text())
        assert config["transformers_version"] == "4.57.3"
        assert {"bad_words_ids", "max_length", "do_sample"} <= set(config["talker_config"]["code_predictor_config"])
        assert json.loads((path / "speech_tokenizer" / "config.json").read_text())["transformers_version"] == "4.57.3"


@pytest.mark.parametrize("name", [sc["name"] for sc in SCENARIOS])
def test_served_codes_and_audio_match_the_official_wrapper(official, model_dirs, name):
    _, _, expected = official
    sc = next(s for s in SCENARIOS if s["name"] == name)
    codes, pcm = _serve(model_dirs[sc["checkpoint"]], sc)
    official_codes = expected[f"{name}/codes"]
    assert official_codes.shape[0] >= 3, "too few frames to compare"
    np.testing.assert_array_equal(codes, official_codes)
    official_pcm = np.frombuffer(pcm16_bytes(expected[f"{name}/wav"]), dtype="<i2")
    assert len(pcm) == len(official_pcm) == codes.shape[0] * 1920
    assert np.sqrt(np.mean(official_pcm.astype(np.float64) ** 2)) > 100  # not near-silent
    diff = np.abs(pcm.astype(np.int32) - official_pcm.astype(np.int32)).max()
    print(f"{name}: {codes.shape[0]} frames, max PCM difference {diff} LSB")
    assert diff <= 2
