"""Uploaded voices of a Base checkpoint, kept in `voxserve.voices_dir` so they survive restarts.

A voice is its reference clip already encoded (the x-vector and, for in-context cloning, the clip's codec codes):
requests that name it skip the reference encoder. One folder per voice: `voice.json` (name, reference text, mode,
frames, creation time), `x_vector.npy`, and `ref_codes.npy` unless the voice is x-vector only. A folder is written
under a temporary name and renamed, so a crash never leaves half a voice. No vLLM, no torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
CODEBOOKS = 16


@dataclass(frozen=True)
class StoredVoice:
    name: str
    ref_text: str
    x_vector_only: bool
    num_ref_frames: int
    created: float
    x_vector: bytes  # float32
    ref_codes: bytes  # int32 [frames, 16]; empty when x-vector only

    def describe(self) -> dict:
        return {"name": self.name, "kind": "uploaded", "ref_text": self.ref_text,
                "x_vector_only_mode": self.x_vector_only, "created": int(self.created)}


class VoiceStore:
    def __init__(self, folder: str | Path, max_voices: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_voices = max_voices
        self._lock = threading.Lock()  # uploads and deletes run in worker threads
        self._voices = {voice.name: voice for voice in (self._load(p) for p in sorted(self.folder.iterdir()))
                        if voice is not None}

    def get(self, name: str) -> StoredVoice | None:
        return self._voices.get(name)

    def list(self) -> list[StoredVoice]:
        return [self._voices[name] for name in sorted(self._voices)]

    def check_new(self, name: str, reserved: set[str]) -> None:
        """ValueError naming `name` for one that cannot be added (before its clip is encoded)."""
        if not NAME_PATTERN.match(name):
            raise ValueError(f"name {name[:80]!r} is not a voice name: 1 to 64 of a-z, 0-9, '_' and '-', starting "
                             "with a letter or digit")
        if name in reserved or name in self._voices:
            raise ValueError(f"name {name!r} is taken; delete it first or choose another")
        if len(self._voices) >= self.max_voices:
            raise ValueError(f"name {name!r}: the server holds its limit of {self.max_voices} voices "
                             "(voxserve.max_voices); delete one first")

    def add(self, name: str, ref_text: str, x_vector: bytes, ref_codes: bytes, num_ref_frames: int,
            reserved: set[str]) -> StoredVoice:
        with self._lock:
            self.check_new(name, reserved)
            voice = StoredVoice(name, ref_text, not ref_codes, num_ref_frames, time.time(), x_vector, ref_codes)
            staging = Path(tempfile.mkdtemp(prefix=".upload-", dir=self.folder))
            meta = {"name": name, "ref_text": ref_text, "x_vector_only_mode": voice.x_vector_only,
                    "num_ref_frames": num_ref_frames, "created": voice.created}
            (staging / "voice.json").write_text(json.dumps(meta))
            np.save(staging / "x_vector.npy", np.frombuffer(x_vector, np.float32))
            if ref_codes:
                np.save(staging / "ref_codes.npy", np.frombuffer(ref_codes, np.int32).reshape(-1, CODEBOOKS))
            os.replace(staging, self.folder / name)
            self._voices[name] = voice
            return voice

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._voices.pop(name, None) is None:
                return False
            shutil.rmtree(self.folder / name, ignore_errors=True)
            return True

    @staticmethod
    def _load(folder: Path) -> StoredVoice | None:
        """A stored voice, or None for what is not one (a staging folder, a stray file, a damaged voice)."""
        if not folder.is_dir() or not NAME_PATTERN.match(folder.name):
            return None
        try:
            meta = json.loads((folder / "voice.json").read_text())
            x_vector = np.load(folder / "x_vector.npy").astype(np.float32).tobytes()
            codes = b""
            if not meta["x_vector_only_mode"]:
                codes = np.load(folder / "ref_codes.npy").astype(np.int32).tobytes()
            return StoredVoice(folder.name, str(meta["ref_text"]), bool(meta["x_vector_only_mode"]),
                               int(meta["num_ref_frames"]), float(meta["created"]), x_vector, codes)
        except (OSError, ValueError, KeyError, TypeError):
            return None
