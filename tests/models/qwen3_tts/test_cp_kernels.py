"""The code predictor's attention operator: its Triton kernel (interpreted on CPU, compiled on GPU) against the
tensor code, and the operator inside a compiled frame."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_voxserve.models.qwen3_tts import cp_kernels

H, KV, D, P = 16, 8, 128, 16  # the code predictor's heads, kv heads, head size and positions


def case(t: int, pos0: int, batch: int = 3, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(t, 1, D, generator=g)

    def make(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    return dict(qkv=make(batch, t, (H + 2 * KV) * D), q_norm=(torch.rand(D, generator=g) + 0.5).to(device, dtype),
                k_norm=(torch.rand(D, generator=g) + 0.5).to(device, dtype), cos=angles.cos().to(device, dtype),
                sin=angles.sin().to(device, dtype), positions=torch.arange(pos0, pos0 + t, device=device),
                k_cache=make(batch, KV, P, D), v_cache=make(batch, KV, P, D))


def run(fn, c):
    c = {k: v.clone() for k, v in c.items()}
    out = fn(c["qkv"], c["q_norm"], c["k_norm"], c["cos"], c["sin"], c["positions"], c["k_cache"], c["v_cache"], H,
             1e-6)
    return out, c["k_cache"], c["v_cache"]


def interpret(script: str) -> None:
    """Run `script` (which prints "ok" last) with TRITON_INTERPRET=1: Triton runs a kernel's program on the CPU. It
    must be set before triton is imported, hence a fresh interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_operator_writes_the_new_positions_and_attends_causally():
    c = case(t=2, pos0=0)
    out, k_cache, v_cache = run(torch.ops.voxserve.code_predictor_attention, c)
    assert out.shape == (3, 2, H * D)
    assert torch.equal(v_cache[:, :, :2], c["qkv"][..., (H + KV) * D:].reshape(3, 2, KV, D).transpose(1, 2))
    assert torch.equal(k_cache[:, :, 2:], c["k_cache"][:, :, 2:])  # other positions untouched
    # position 0 sees only itself: each of its heads returns its kv head's new value
    first = out[:, 0].reshape(3, KV, H // KV, D)
    torch.testing.assert_close(first, v_cache[:, :, 0, None].expand_as(first))


def test_triton_kernel_matches_the_tensor_code_in_the_interpreter():
    pytest.importorskip("triton")
    script = """
import torch
from tests.models.qwen3_tts.test_cp_kernels import case, run
from vllm_voxserve.models.qwen3_tts import cp_kernels as ca
for t, pos0 in ((2, 0), (1, 5), (1, 15)):
    c = case(t, pos0)
    for want, got in zip(run(ca.attention_reference, c), run(ca.attention_triton, c)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
print("ok")
"""
    interpret(script)


@pytest.mark.gpu
def test_gpu_kernel_matches_the_tensor_code_in_bf16():
    for t, pos0 in ((2, 0), (1, 7), (1, 15)):
        c = case(t, pos0, batch=64, dtype=torch.bfloat16, device="cuda")
        for want, got in zip(run(cp_kernels.attention_reference, c), run(cp_kernels.attention_triton, c)):
            torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_top_candidates_operator_is_topk_on_cpu():
    logits = torch.randn(4, 2048, generator=torch.Generator().manual_seed(1))
    values, ids = torch.ops.voxserve.top_candidates(logits, 50)
    want_values, want_ids = logits.topk(50)
    assert torch.equal(values, want_values) and torch.equal(ids, want_ids)


def test_top_candidates_kernel_matches_topk_in_the_interpreter():
    pytest.importorskip("triton")
    script = """
import torch
from vllm_voxserve.models.qwen3_tts import cp_kernels
g = torch.Generator().manual_seed(2)
for vocab, k in ((2048, 50), (1000, 64)):  # a vocabulary that is not a power of two is padded
    logits = torch.randn(2, vocab, generator=g) * 3  # rows are slow in the interpreter
    logits[0, 7] = logits[0, 9] = 50.0  # a tie: the lower id first
    values, ids = cp_kernels.top_candidates_triton(logits, k)
    want_values, want_ids = logits.topk(k)
    assert torch.equal(values, want_values), (values - want_values).abs().max()
    assert ids[0, :2].tolist() == [7, 9]
    assert torch.equal(ids[1:], want_ids[1:])
print("ok")
"""
    interpret(script)


@pytest.mark.gpu
def test_gpu_top_candidates_kernel_matches_topk():
    logits = torch.randn(128, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    values, ids = cp_kernels.top_candidates_triton(logits, 50)
    want_values, want_ids = logits.topk(50)
    assert torch.equal(values, want_values) and torch.equal(ids, want_ids)


def test_kernels_compile_for_the_h200_without_spilling_registers():
    """Triton compiles for a GPU target without a GPU: sm_90 code of both kernels, checked with Triton's own ptxas."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("Triton's CUDA backend is not installed")
    pointers = dict.fromkeys(("qkv", "q_norm", "k_norm", "cos", "sin", "k_cache", "v_cache", "out"), "*bf16")
    ints = dict.fromkeys(("t", "s_qkv_b", "s_qkv_t", "s_k_b", "s_k_h", "s_k_p", "s_v_b", "s_v_h", "s_v_p", "s_out_b",
                          "s_out_t"), "i32")
    kernels = {
        "attention": ASTSource(cp_kernels._attention_kernel,
                               {**pointers, "positions": "*i64", **ints, "eps": "fp32", "scale": "fp32",
                                **dict.fromkeys(("NUM_HEADS", "NUM_KV", "D", "P"), "constexpr")},
                               constexprs={"NUM_HEADS": H, "NUM_KV": KV, "D": D, "P": P}),
        "top candidates": ASTSource(cp_kernels._top_candidates_kernel,
                                    {"logits": "*fp32", "values": "*fp32", "ids": "*i64", "s_logits": "i32",
                                     "s_values": "i32", "s_ids": "i32", "vocab": "i32", "k": "i32",
                                     "V_PAD": "constexpr"}, constexprs={"V_PAD": 2048}),
    }
    for name, source in kernels.items():
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        ptx = Path(os.environ.get("TMPDIR", "/tmp")) / f"voxserve_{os.getpid()}.ptx"
        ptx.write_text(compiled.asm["ptx"])
        try:
            report = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", os.devnull],
                                    capture_output=True, text=True, timeout=120)
        finally:
            ptx.unlink()
        assert report.returncode == 0, report.stderr
        assert "0 bytes spill stores" in report.stdout + report.stderr, (name, report.stderr)
