"""Where a Qwen3-TTS checkpoint's files are, and whether all the files the server reads are there.

`vllm serve` takes a local directory or a Hugging Face repo id (`Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice`). vLLM reads
config.json and the weights through the hub cache itself, but the speech tokenizer (`speech_tokenizer/`), the text
tokenizer files and generation_config.json are read here, from a directory: `resolve_model_dir` maps a repo id to
its snapshot folder in the hub cache (`snapshot_download`, which downloads what is missing unless HF_HUB_OFFLINE is
set), honouring vLLM's --revision and --download-dir. (vLLM 0.26 hands the model its snapshot folder itself when
HF_HUB_OFFLINE is set, and the repo id otherwise.) `check_model_dir` names every missing file in one error.
"""

from __future__ import annotations

import json
from pathlib import Path

SPEECH_TOKENIZER_DIR = "speech_tokenizer"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TEXT_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
# What a snapshot download fetches: configs, weights, tokenizer files and the speech tokenizer (not README, assets).
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "*.txt", f"{SPEECH_TOKENIZER_DIR}/*")


class CheckpointFilesMissing(FileNotFoundError):
    """A checkpoint directory lacks files the server reads; the message names all of them."""


def resolve_model_dir(model: str | Path, revision: str | None = None, download_dir: str | None = None) -> Path:
    """A local directory as it is; otherwise `model` is a hub repo id, resolved to its snapshot folder."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE
    try:
        folder = snapshot_download(str(model), revision=revision, cache_dir=download_dir,
                                   allow_patterns=list(DOWNLOAD_PATTERNS), local_files_only=offline)
    except HFValidationError as exc:
        raise CheckpointFilesMissing(f"model {str(model)!r} is neither a directory nor a Hugging Face repo id") from exc
    except LocalEntryNotFoundError as exc:
        where = download_dir or constants.HF_HUB_CACHE
        why = "HF_HUB_OFFLINE is set" if offline else "it could not be downloaded"
        raise CheckpointFilesMissing(f"model {str(model)!r} (revision {revision or 'main'}) is not in the Hugging Face "
                                     f"cache {where} and {why}") from exc
    return Path(folder)


def missing_files(model_dir: str | Path) -> list[str]:
    """The files the server reads that `model_dir` lacks, as paths relative to it (empty when complete)."""
    root = Path(model_dir)
    missing = [name for name in ("config.json", *TEXT_TOKENIZER_FILES) if not (root / name).is_file()]
    index = root / WEIGHTS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError):
            shards = []
            missing.append(f"{WEIGHTS_INDEX} (no weight_map)")
        missing += [shard for shard in shards if not (root / shard).is_file()]
    elif not (root / WEIGHTS_FILE).is_file():
        missing.append(f"{WEIGHTS_FILE} (or {WEIGHTS_INDEX} and its shards)")
    codec = root / SPEECH_TOKENIZER_DIR
    missing += [f"{SPEECH_TOKENIZER_DIR}/{name}" for name in ("config.json", WEIGHTS_FILE)
                if not (codec / name).is_file()]
    return missing


def check_model_dir(model_dir: str | Path, model: str | Path | None = None) -> Path:
    """`model_dir` when it holds every file the server reads; else one error naming the missing ones."""
    missing = missing_files(model_dir)
    if missing:
        shown = f"{model} ({model_dir})" if model is not None and str(model) != str(model_dir) else str(model_dir)
        raise CheckpointFilesMissing(
            f"the Qwen3-TTS checkpoint {shown} lacks {', '.join(missing)}; a checkpoint needs config.json, the "
            f"weights, {', '.join(TEXT_TOKENIZER_FILES)} and {SPEECH_TOKENIZER_DIR}/ (config.json, {WEIGHTS_FILE}), "
            "as the hub repos ship them")
    return Path(model_dir)


def resolve_and_check(model: str | Path, revision: str | None = None, download_dir: str | None = None) -> Path:
    return check_model_dir(resolve_model_dir(model, revision, download_dir), model)
