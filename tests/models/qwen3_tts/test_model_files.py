"""Checkpoint folders: a hub repo id resolves through a hub cache laid out as the hub client lays it out (offline),
and a folder missing files the server reads is refused with one error naming them all."""

from __future__ import annotations

import json

import huggingface_hub
import pytest

from tests.hub_cache import COMMIT, lay_out_hub_cache
from vllm_voxserve.models.qwen3_tts.model_files import (
    CheckpointFilesMissing,
    check_model_dir,
    missing_files,
    resolve_and_check,
    resolve_model_dir,
)

REPO = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
FILES = ("config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
         "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
         "speech_tokenizer/preprocessor_config.json")


def _folder(root, files=FILES):
    for i, name in enumerate(files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps({"file": i}))
    return root


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = lay_out_hub_cache(_folder(tmp_path / "src"), cache, REPO)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache, snapshot


def test_the_laid_out_cache_is_one_the_hub_client_reads(offline_cache):
    cache, _ = offline_cache
    info = huggingface_hub.scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.refs["main"].commit_hash == COMMIT
    assert {f.file_path.relative_to(repo.refs["main"].snapshot_path).as_posix()
            for f in repo.refs["main"].files} == set(FILES)


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(offline_cache):
    _, snapshot = offline_cache
    assert resolve_model_dir(REPO) == snapshot
    assert resolve_model_dir(REPO, revision=COMMIT) == snapshot
    assert resolve_and_check(REPO) == snapshot
    assert (resolve_model_dir(REPO) / "speech_tokenizer" / "config.json").read_text() == json.dumps({"file": 6})


def test_vllms_download_dir_is_the_cache_it_names(offline_cache, monkeypatch, tmp_path):
    cache, snapshot = offline_cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert resolve_model_dir(REPO, download_dir=str(cache)) == snapshot
    with pytest.raises(CheckpointFilesMissing, match="not in the Hugging Face cache .*elsewhere.*HF_HUB_OFFLINE"):
        resolve_model_dir(REPO)


def test_an_uncached_id_or_a_missing_folder_is_one_clear_error(offline_cache):
    with pytest.raises(CheckpointFilesMissing, match="Qwen/Qwen3-TTS-12Hz-0.6B-Base.*not in the Hugging Face cache"):
        resolve_model_dir("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    with pytest.raises(CheckpointFilesMissing, match="neither a directory nor a Hugging Face repo id"):
        resolve_model_dir("/no/such/checkpoint/folder")


def test_a_local_folder_is_used_as_it_is(tmp_path):
    folder = _folder(tmp_path / "ckpt")
    assert resolve_and_check(folder) == folder
    assert missing_files(folder) == []


def test_every_missing_file_is_named_in_one_error(tmp_path):
    folder = _folder(tmp_path / "ckpt", [f for f in FILES if f not in ("merges.txt", "speech_tokenizer/config.json",
                                                                        "model.safetensors")])
    assert missing_files(folder) == ["merges.txt", "model.safetensors (or model.safetensors.index.json and its shards)",
                                     "speech_tokenizer/config.json"]
    with pytest.raises(CheckpointFilesMissing, match="lacks merges.txt, model.safetensors .*speech_tokenizer/config"):
        check_model_dir(folder)
    assert missing_files(tmp_path / "empty") == [
        "config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
        "model.safetensors (or model.safetensors.index.json and its shards)", "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors"]


def test_sharded_weights_need_every_shard_the_index_names(tmp_path):
    folder = _folder(tmp_path / "ckpt", [f for f in FILES if f != "model.safetensors"])
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    (folder / shards[0]).write_text("x")
    assert missing_files(folder) == [shards[1]]
    (folder / shards[1]).write_text("x")
    assert missing_files(folder) == []
