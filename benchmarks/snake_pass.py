"""Why a SnakeBeta pass between the codec's convs is slow: one compiled pass over the vocoder's widest activation
(96 channels, 1920 columns a frame) in several forms, beside a plain copy of the same bytes.

    python -m benchmarks.snake_pass --batch 64 --frames 10

Runs 2026-12-01_dde307c and 2026-12-02_05bb732 H200 profiles of the compiled codec (64 chunks of 10 frames) show each
SnakeBeta + history concat pass at this size taking 1.2 ms, about 0.4 TB/s; alone with static sizes it took 0.36 ms.
The forms: the pass as the codec runs it (history from the packed state block, new history written back), with the
batch dynamic, with the batch and the length dynamic (as the compiled codec's sizes), with a contiguous history,
without the concat, SnakeBeta alone on a channels-last tensor, and a copy.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.codec_conv_tiles import time_ms
from vllm_voxserve.models.qwen3_tts.codec.layers import snake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--channels", type=int, default=96)
    ap.add_argument("--history", type=int, default=54)
    ap.add_argument("--out")
    args = ap.parse_args()
    b, c, h, n = args.batch, args.channels, args.history, args.frames * 1920
    x = torch.randn(b, c, n, device="cuda").bfloat16()
    alpha, beta = (torch.randn(2, c, device="cuda") * 0.3).bfloat16()
    packed = torch.randn(b, 1_300_000, device="cuda").bfloat16()  # a state block: one row per request
    packed_history = packed[:, 5000:5000 + c * h].view(b, c, h)
    history = packed_history.contiguous()

    def with_history(x, hist, alpha, beta):
        ext = torch.cat([hist, snake(x, alpha, beta)], dim=-1)
        return ext, ext[..., -h:].reshape(x.shape[0], -1)

    def dynamic(*dims):
        """A compiled pass of its own (dynamo caches by code object) over copies of the inputs with these dims of
        `x` (and the batch of the history) marked dynamic, as the codec program marks its inputs."""
        xd, hd = x.clone(), packed.clone()[:, 5000:5000 + c * h].view(b, c, h)
        for dim in dims:
            torch._dynamo.mark_dynamic(xd, dim)
        torch._dynamo.mark_dynamic(hd, 0)
        return torch.compile(lambda x, hist, alpha, beta: with_history(x, hist, alpha, beta)), (xd, hd, alpha, beta)

    forms = {
        "snake+cat, packed history": (torch.compile(with_history), (x, packed_history, alpha, beta)),
        "snake+cat, batch dynamic": dynamic(0),
        "snake+cat, batch and length dynamic": dynamic(0, 2),
        "snake+cat, contiguous history": (torch.compile(lambda *a: with_history(*a)), (x, history, alpha, beta)),
        "snake alone": (torch.compile(snake), (x, alpha, beta)),
        "snake alone, channels-last input": (torch.compile(snake),
                                             (x.transpose(1, 2).contiguous().transpose(1, 2), alpha, beta)),
        "sin alone": (torch.compile(lambda x: torch.sin(x.float()).to(x.dtype)), (x,)),
        "copy": (lambda x: x.clone(), (x,)),
    }
    gigabytes = 2 * x.numel() * x.element_size() / 1e9
    result = {"shape": [b, c, n], "read_and_write_gb": gigabytes}
    with torch.inference_mode():
        for name, (fn, fn_args) in forms.items():
            ms = time_ms(lambda: fn(*fn_args), reps=10)
            result[name] = round(ms, 4)
            print(f"{name:36s} {ms:7.3f} ms  {gigabytes / ms:6.2f} TB/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
