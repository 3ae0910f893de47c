"""Two operators of the code predictor's frame, each one Triton kernel on GPU and plain tensor code on CPU.

torch.library custom ops, so torch.compile and CUDA graphs see one opaque call each.

`code_predictor_attention(qkv, ...)`: the attention for the one or two new positions of a layer pass: from the
layer's fused QKV projection [B, t, (H + 2 KV) d], the per-head RMS norms of q and k, their rotary embedding, the
new k/v written into the caches [B, KV, 16, d] (in place) and attention over every cached position up to each
query's own -> [B, t, H d]. On CPU it is `attention_reference` (plain tensor code); on GPU one Triton kernel per
(row, kv head) does all of it, where the tensor code takes about seven kernels (norms and rotary, two cache writes,
two matmuls, a softmax: roughly a third of a layer pass at batch 64 on the H200, judged by kernel names;
benchmarks/results/h200/2026-11-30_bb84cd0/). It mutates the caches.

`top_candidates(logits, k)`: each row's k largest logits, largest first, and their ids (as `torch.topk`, ties to the
lower id): one sorting kernel per row instead of torch.topk's selection and sorting kernels, 27 µs of each of a
frame's 15 sampling steps at batch 64 on the H200.
"""

from __future__ import annotations

import torch

try:  # the GPU path; CPU-only installs run the reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)  # as talker.RMSNorm


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attention_reference(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        num_heads: int, eps: float) -> torch.Tensor:
    """Tensor code of the operator. cos/sin [t, 1, d] and positions [t] of the new positions (consecutive)."""
    b, t, _ = qkv.shape
    nkv, positions_cached, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    rep = num_heads // nkv
    q, k, v = qkv.split([num_heads * d, nkv * d, nkv * d], dim=-1)
    q = _rotate(rms_norm(q.reshape(b, t, num_heads, d), q_norm, eps), cos, sin)
    k = _rotate(rms_norm(k.reshape(b, t, nkv, d), k_norm, eps), cos, sin)
    k_cache.index_copy_(2, positions, k.transpose(1, 2))
    v_cache.index_copy_(2, positions, v.reshape(b, t, nkv, d).transpose(1, 2))
    # query head h reads kv head h // rep (the official repeat_interleave): group queries by kv head
    qg = q.reshape(b, t, nkv, rep, d).permute(0, 2, 1, 3, 4).reshape(b, nkv, t * rep, d)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * d ** -0.5  # [B, nkv, t*rep, 16]
    visible = torch.arange(positions_cached, device=qkv.device)[None, :] <= positions[:, None]  # [t, 16]
    scores = scores.masked_fill(~visible.repeat_interleave(rep, dim=0), float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1).to(qkv.dtype), v_cache)  # [B, nkv, t*rep, d]
    return out.reshape(b, nkv, t, rep, d).permute(0, 2, 1, 3, 4).reshape(b, t, num_heads * d)


@torch.library.custom_op("voxserve::code_predictor_attention", mutates_args=("k_cache", "v_cache"))
def code_predictor_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             num_heads: int, eps: float) -> torch.Tensor:
    if qkv.is_cuda and triton is not None:
        return attention_triton(qkv, q_norm, k_norm, cos, sin, positions, k_cache, v_cache, num_heads, eps)
    return attention_reference(qkv, q_norm, k_norm, cos, sin, positions, k_cache, v_cache, num_heads, eps)


@code_predictor_attention.register_fake
def _(qkv, q_norm, k_norm, cos, sin, positions, k_cache, v_cache, num_heads, eps):
    return qkv.new_empty(qkv.shape[0], qkv.shape[1], num_heads * k_cache.shape[3])


def attention_triton(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     num_heads: int, eps: float) -> torch.Tensor:
    """The operator as one Triton kernel (also runs under TRITON_INTERPRET=1 on CPU tensors, for tests)."""
    b, t, _ = qkv.shape
    nkv, positions_cached, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if t > 2 or k_cache.stride(3) != 1 or not qkv.is_contiguous():
        raise ValueError("code_predictor_attention: t <= 2 new positions, contiguous qkv and unit-stride heads")
    out = qkv.new_empty(b, t, num_heads * d)
    cos2, sin2 = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    _attention_kernel[(b, nkv)](
        qkv, q_norm, k_norm, cos2, sin2, positions, k_cache, v_cache, out, t, eps, d ** -0.5,
        qkv.stride(0), qkv.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, NUM_KV=nkv, D=d, P=positions_cached)
    return out


if triton is not None:

    @triton.jit
    def _attention_kernel(qkv, q_norm, k_norm, cos, sin, positions, k_cache, v_cache, out, t, eps, scale,
                          s_qkv_b, s_qkv_t, s_k_b, s_k_h, s_k_p, s_v_b, s_v_h, s_v_p, s_out_b, s_out_t,
                          NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, D: tl.constexpr, P: tl.constexpr):
        row, kvh = tl.program_id(0), tl.program_id(1)
        d = tl.arange(0, D)
        half: tl.constexpr = D // 2
        rot = tl.where(d < half, d + half, d - half)  # rotate_half reads the other half, negated in the first
        sign = tl.where(d < half, -1.0, 1.0)
        p = tl.arange(0, P)
        pos0 = tl.load(positions)
        k_ptrs = k_cache + row * s_k_b + kvh * s_k_h + p[:, None] * s_k_p + d[None, :]
        v_ptrs = v_cache + row * s_v_b + kvh * s_v_h + p[:, None] * s_v_p + d[None, :]
        keys = tl.load(k_ptrs).to(tl.float32)
        values = tl.load(v_ptrs).to(tl.float32)
        kw, kw_rot = tl.load(k_norm + d).to(tl.float32), tl.load(k_norm + rot).to(tl.float32)
        qw, qw_rot = tl.load(q_norm + d).to(tl.float32), tl.load(q_norm + rot).to(tl.float32)
        cache_ty = k_cache.dtype.element_ty
        # the new keys and values: into the caches, and into the tiles read below (rounded as the cache holds them)
        for i in tl.static_range(2):
            if i < t:
                base = qkv + row * s_qkv_b + i * s_qkv_t
                c, s = tl.load(cos + i * D + d).to(tl.float32), tl.load(sin + i * D + d).to(tl.float32)
                k_at = base + (NUM_HEADS + kvh) * D
                kx, kx_rot = tl.load(k_at + d).to(tl.float32), tl.load(k_at + rot).to(tl.float32)
                r = tl.rsqrt(tl.sum(kx * kx, 0) / D + eps)
                k_new = ((kx * r * kw) * c + sign * (kx_rot * r * kw_rot) * s).to(cache_ty)
                v_new = tl.load(base + (NUM_HEADS + NUM_KV + kvh) * D + d).to(cache_ty)
                pos = pos0 + i
                tl.store(k_cache + row * s_k_b + kvh * s_k_h + pos * s_k_p + d, k_new)
                tl.store(v_cache + row * s_v_b + kvh * s_v_h + pos * s_v_p + d, v_new)
                keys = tl.where(p[:, None] == pos, k_new.to(tl.float32)[None, :], keys)
                values = tl.where(p[:, None] == pos, v_new.to(tl.float32)[None, :], values)
        # each query head of this kv head, at each new position: attention over positions 0 .. its own
        for i in tl.static_range(2):
            if i < t:
                base = qkv + row * s_qkv_b + i * s_qkv_t
                c, s = tl.load(cos + i * D + d).to(tl.float32), tl.load(sin + i * D + d).to(tl.float32)
                for j in tl.static_range(NUM_HEADS // NUM_KV):
                    head = kvh * (NUM_HEADS // NUM_KV) + j
                    qx, qx_rot = tl.load(base + head * D + d).to(tl.float32), tl.load(base + head * D + rot).to(
                        tl.float32)
                    r = tl.rsqrt(tl.sum(qx * qx, 0) / D + eps)
                    q = (qx * r * qw) * c + sign * (qx_rot * r * qw_rot) * s
                    scores = tl.sum(q[None, :] * keys, 1) * scale
                    scores = tl.where(p <= pos0 + i, scores, float("-inf"))
                    weights = tl.exp(scores - tl.max(scores, 0))
                    o = tl.sum((weights / tl.sum(weights, 0))[:, None] * values, 0)
                    tl.store(out + row * s_out_b + i * s_out_t + head * D + d, o.to(out.dtype.element_ty))


@torch.library.custom_op("voxserve::top_candidates", mutates_args=())
def top_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda and triton is not None:
        return top_candidates_triton(logits, k)
    return logits.topk(k, dim=-1)


@top_candidates.register_fake
def _(logits, k):
    return logits.new_empty(logits.shape[0], k), logits.new_empty(logits.shape[0], k, dtype=torch.long)


def top_candidates_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_candidates` of float32 logits [B, V] as one Triton kernel (also under TRITON_INTERPRET=1 on CPU)."""
    rows, vocab = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1 or not 1 <= k <= vocab:
        raise ValueError("top_candidates: float32 logits with unit-stride rows and 1 <= k <= vocabulary")
    values = logits.new_empty(rows, k)
    ids = logits.new_empty(rows, k, dtype=torch.long)
    _top_candidates_kernel[(rows,)](logits, values, ids, logits.stride(0), values.stride(0), ids.stride(0), vocab, k,
                                    V_PAD=triton.next_power_of_2(vocab))
    return values, ids


if triton is not None:

    @triton.jit
    def _top_candidates_kernel(logits, values, ids, s_logits, s_values, s_ids, vocab, k, V_PAD: tl.constexpr):
        row = tl.program_id(0)
        v = tl.arange(0, V_PAD)
        x = tl.load(logits + row * s_logits + v, mask=v < vocab, other=float("-inf"))
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # as signed ints, ordered as the floats are
        key = (ordered.to(tl.int64) << 32) | (V_PAD - 1 - v).to(tl.int64)  # equal values: the lower id first
        key = tl.sort(key, descending=True)  # position i now holds the (i+1)-th largest
        high = (key >> 32).to(tl.int32)
        value = tl.where(high >= 0, high, high ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        token = V_PAD - 1 - (key & 0xFFFFFFFF)
        tl.store(values + row * s_values + v, value, mask=v < k)
        tl.store(ids + row * s_ids + v, token, mask=v < k)
