"""`embed_plan` on the GPU: its host ids reach the device without waiting for the stream's queued work, and give
the CPU's embeddings for every kind of codec slot (tokens, the speaker, reference frames)."""
from __future__ import annotations

import pytest
import torch

from vllm_voxserve.models.qwen3_tts.checkpoint import make_checkpoint
from vllm_voxserve.models.qwen3_tts.loader import load_talker_side
from vllm_voxserve.models.qwen3_tts.prompt import SpeechPrompt, build_plan
from vllm_voxserve.models.qwen3_tts.talker import embed_plan_with

TEXT = (9707, 11, 1879, 0, 1096, 374, 264, 1273, 13)


@pytest.mark.gpu
def test_gpu_plan_embeddings_equal_the_cpu_ones_and_do_not_wait_for_the_stream(tmp_path):
    path = make_checkpoint(tmp_path / "base", "tiny", "base", "float32", seed=3, with_codec_and_tokenizer=False)
    cpu = load_talker_side(path, dtype=torch.float32)
    gpu = load_talker_side(path, dtype=torch.float32, device="cuda")
    prompts = [SpeechPrompt(text_ids=TEXT, language="english", x_vector_only=True, non_streaming=False),
               SpeechPrompt(text_ids=TEXT, language="english", ref_text_ids=(40, 1079, 264), num_ref_frames=6,
                            non_streaming=False)]
    hidden = cpu.talker.config.hidden_size
    x_vector = torch.randn(hidden, generator=torch.Generator().manual_seed(0))
    ref_codes = torch.randint(0, 2048, (6, 16), generator=torch.Generator().manual_seed(1))
    x_vector_gpu, ref_codes_gpu = x_vector.cuda(), ref_codes.cuda()  # served, both come from the device
    for prompt in prompts:
        plan = build_plan(cpu.tables, prompt)
        with torch.no_grad():
            expected = embed_plan_with(cpu.talker, plan, x_vector, ref_codes)
            embed_plan_with(gpu.talker, plan, x_vector_gpu, ref_codes_gpu)  # warm: first-use allocations may sync
            torch.cuda.synchronize()
            busy = torch.cuda.Event()
            torch.cuda._sleep(200_000_000)  # a long kernel ahead in the stream, as an engine step in flight
            busy.record()
            got = embed_plan_with(gpu.talker, plan, x_vector_gpu, ref_codes_gpu)
            assert not busy.query(), "embed_plan waited for the stream's queued work"
            torch.cuda.synchronize()
        for ours, theirs in zip(got, expected, strict=True):
            torch.testing.assert_close(ours.cpu(), theirs, rtol=1e-4, atol=1e-5)
