"""`vllm serve <hub repo id> --plugin voxserve` on CPU, offline, from a Hugging Face cache holding a checkpoint that
the official qwen-tts 0.1.1 code wrote with its own `save_pretrained` (model and speech tokenizer, transformers
4.57.3) plus the text tokenizer files: it serves it unchanged. And a folder missing files is refused at start-up
with one error naming them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.hub_cache import lay_out_hub_cache
from tests.models.qwen3_tts.conftest import official_python, run_official  # noqa: F401  (fixture)
from tests.speech_server import SERVED_NAME, free_port, speech_server, vllm_command
from vllm_voxserve.models.qwen3_tts.checkpoint import make_checkpoint
from vllm_voxserve.models.qwen3_tts.tokenizer import write_tokenizer_files

pytestmark = [pytest.mark.server, pytest.mark.parity, pytest.mark.slow]

OFFICIAL = Path(__file__).parents[1] / "models" / "qwen3_tts" / "official" / "saved_checkpoint_side.py"
HUB_REPO = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
SAMPLES_PER_FRAME = 1920


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory, official_python):  # noqa: F811
    root = tmp_path_factory.mktemp("official_saved")
    source = make_checkpoint(root / "weights", "tiny", "custom_voice", "float32", seed=3)
    out = write_tokenizer_files(root / "saved")
    spec = {"checkpoints": {"cv": {"source": str(source), "out": str(out)}}, "scenarios": []}
    (root / "spec.json").write_text(json.dumps(spec))
    run_official(official_python, OFFICIAL, str(root / "spec.json"), timeout=600)
    assert json.loads((out / "config.json").read_text())["transformers_version"] == "4.57.3"
    return out


def test_a_hub_id_serves_the_official_save_from_the_offline_cache(saved_checkpoint, tmp_path):
    home = tmp_path / "hf_home"
    lay_out_hub_cache(saved_checkpoint, home / "hub", HUB_REPO)
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}
    log = tmp_path / "serve.log"
    with speech_server(HUB_REPO, spelling="flag", env=env, log_path=log) as url:
        body = {"model": SERVED_NAME, "input": "Hello from the hub cache.", "voice": "ryan", "response_format": "pcm",
                "max_new_tokens": 12, "ignore_eos": True, "seed": 1}
        response = requests.post(f"{url}/v1/audio/speech", json=body, timeout=300)
        assert response.status_code == 200, response.text
        pcm = np.frombuffer(response.content, dtype="<i2")
        assert len(pcm) == 11 * SAMPLES_PER_FRAME  # 12 tokens -> 11 frames (the last token never becomes audio)
        assert np.abs(pcm).max() > 0
        voices = requests.get(f"{url}/v1/audio/voices", timeout=30)
        assert voices.status_code == 200 and "ryan" in voices.text


def test_a_folder_missing_files_is_refused_at_start_naming_them(saved_checkpoint, tmp_path):
    folder = tmp_path / "incomplete"
    for file in saved_checkpoint.rglob("*"):
        relative = file.relative_to(saved_checkpoint)
        if file.is_file() and relative.as_posix() not in ("vocab.json", "speech_tokenizer/model.safetensors"):
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).symlink_to(file)
    cmd = [vllm_command(), "serve", str(folder), "--plugin", "voxserve", "--port", str(free_port()),
           "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind")
    env.pop("VLLM_PLUGINS", None)
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "lacks vocab.json, speech_tokenizer/model.safetensors;" in output, output[-3000:]
    assert "sentencepiece" not in output.lower() and "tiktoken" not in output.lower()
    print(f"refused after {time.monotonic() - started:.0f} s")
