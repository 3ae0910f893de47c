"""Base checkpoints (voice cloning): the reference clip becomes an x-vector and reference codes in the API server,
before the request reaches the engine.

Encoding in the worker ran on the engine's step loop: one 10-minute clip stopped every other stream's audio for
about 25 s. Here it runs in one background thread of the API server, on its CPU (the encoders are small beside the
talker, and the engine's GPU memory stays the engine's); the engine only sees requests whose reference is ready, so
it never waits. One thread bounds the CPU that concurrent clones can take from the engine's host work.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from vllm_voxserve.contract import SAMPLE_RATE
from vllm_voxserve.fault_injection import sleep_if_slowed
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_codec_encoder, load_speaker_encoder
from vllm_voxserve.models.qwen3_tts.job import SpeechJob


class ReferenceEncoder:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        cpu = torch.device("cpu")
        self.speaker_encoder = load_speaker_encoder(model_dir, torch.float32, cpu)
        self.codec_encoder = load_codec_encoder(model_dir / "speech_tokenizer", torch.float32, cpu)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voxserve-reference")

    async def encode(self, job: SpeechJob) -> SpeechJob:
        """The job with its reference clip replaced by the x-vector (and, for ICL, the codes); ValueError for a clip
        the encoders refuse (the client's to fix)."""
        if not job.ref_audio:
            return job
        loop = asyncio.get_running_loop()
        x_vector, codes = await loop.run_in_executor(self._executor, self.encode_now, job.ref_audio,
                                                     job.prompt.x_vector_only)
        return dataclasses.replace(job, ref_audio=b"", x_vector=x_vector, ref_codes=codes)

    async def encode_clip(self, audio: bytes, x_vector_only: bool) -> tuple[bytes, bytes]:
        """`encode_now` on the encoder's thread (an uploaded voice, encoded once)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.encode_now, audio, x_vector_only)

    @torch.inference_mode()
    def encode_now(self, ref_audio: bytes, x_vector_only: bool) -> tuple[bytes, bytes]:
        """(x-vector as float32 bytes, reference codes [frames, 16] as int32 bytes, empty with `x_vector_only`)."""
        sleep_if_slowed()
        wav = torch.from_numpy(np.frombuffer(ref_audio, dtype=np.float32).copy())
        x_vector = self.speaker_encoder.extract_xvector(wav).float().numpy().tobytes()
        if x_vector_only:
            return x_vector, b""
        codes = self.codec_encoder.encode(wav, SAMPLE_RATE)
        return x_vector, codes.to(torch.int32).numpy().tobytes()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
