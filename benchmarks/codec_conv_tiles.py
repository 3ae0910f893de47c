"""Tile sizes of the codec's conv kernel (codec/conv_kernels.py) for each residual-unit conv of the served decoder.

    python -m benchmarks.codec_conv_tiles --shapes 64x10,16x10,4x5 --out tiles.json

For every conv a residual unit runs (the dilated conv k7 and the SnakeBeta -> conv k1 -> + input tail, at 768, 384, 192
and 96 channels) and every (chunks x frames) shape, the kernel's time with each candidate tile, and cuDNN's conv1d of
the same shape beside it (the served form's conv, without its layout conversions and element-wise passes). Prints the
tile with the least total time over the shapes for each (channels, out channels, taps): `conv_kernels.TILES`. With
`--tma`, the k7 convs on the TMA kernel too (codec/tma_conv.py, its input time-major as the decoder makes it), each
of TMA_CANDIDATES: `tma_conv.TILES`.
One GPU, bf16, CUDA events over repeated calls (each call is 0.01-2 ms of device work).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn import functional as F

from vllm_voxserve.models.qwen3_tts.codec import conv_kernels, tma_conv
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig

# (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages[, flat]): conv_kernels.TILES
CANDIDATES = [(64, 64, 32, 4, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 32, 8, 3),
              (32, 128, 32, 4, 3), (64, 256, 32, 8, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3),
              (128, 128, 32, 8, 3, True), (128, 128, 64, 8, 3, True), (64, 128, 64, 4, 4, True),
              (128, 256, 64, 8, 3, True)]

# (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages): tma_conv.TILES; a BLOCK_C that does not divide the channels is
# skipped
TMA_CANDIDATES = [(128, 128, 32, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
                  (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 256, 64, 8, 3), (128, 128, 32, 4, 5)]


def residual_convs(config: CodecDecoderConfig) -> list[tuple[int, int, int, int]]:
    """(channels, taps, dilation, output columns per frame) of the residual-unit convs of a decoder."""
    convs, columns = [], 4  # the vocoder's input: 4 columns a frame after the two x2 upsamplers
    for i, rate in enumerate(config.upsample_rates):
        channels, columns = config.decoder_dim // 2 ** (i + 1), columns * rate
        convs += [(channels, 7, dilation, columns) for dilation in (1, 3, 9)]
        convs.append((channels, 1, 1, columns))  # the three units' tails have one shape
    return convs


def time_ms(fn, reps: int) -> float:
    fn()
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x10,16x10,4x5")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--taps", help="only the convs with this many taps (7: the dilated convs, 1: the tails)")
    ap.add_argument("--tma", action="store_true", help="the k7 convs on the TMA kernel too (TMA_CANDIDATES)")
    ap.add_argument("--served-tiles-only", action="store_true",
                    help="of the channels-first kernel's tiles, only the one conv_kernels.TILES serves")
    ap.add_argument("--out")
    args = ap.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    rows, totals = [], {}
    for channels, taps, dilation, per_frame in residual_convs(CodecDecoderConfig()):
        if args.taps and taps != int(args.taps):
            continue
        tail = taps == 1
        for batch, frames in shapes:
            g = torch.Generator(device="cuda").manual_seed(channels)
            length = frames * per_frame
            def make(*shape, scale=1.0):
                return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

            x = make(batch, channels, length + (taps - 1) * dilation)
            w = make(channels, channels, taps, scale=(channels * taps) ** -0.5)
            w = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # tap-major, as use_conv_kernels stores it
            b = make(channels)
            alpha, beta = make(2, channels, scale=0.3) if tail else (None, None)
            res = make(batch, channels, length) if tail else None
            row = {"channels": channels, "taps": taps, "dilation": dilation, "batch": batch, "frames": frames,
                   "cudnn_ms": time_ms(lambda: F.conv1d(x, w, b, dilation=dilation), args.reps)}
            want = conv_kernels.conv_reference(*(t if t is None else t.float() for t in (x, w, b, alpha, beta, res)),
                                               dilation)
            candidates = CANDIDATES
            if args.served_tiles_only:
                served = conv_kernels.TILES.get((channels, channels, taps))
                candidates = [served] if served else []
            time_tiles(row, totals, (channels, channels, taps), conv_kernels.TILES, (channels, channels, taps),
                       candidates, lambda: conv_kernels.conv_triton(x, w, b, alpha, beta, res, dilation), want,
                       args.reps)
            if args.tma and taps == 7:
                x_tm = x.transpose(1, 2).contiguous()
                time_tiles(row, totals, ("tma", channels), tma_conv.TILES, channels,
                           [t for t in TMA_CANDIDATES if channels % t[2] == 0],
                           lambda: tma_conv.tma_conv_triton(x_tm, w, b, dilation), want, args.reps, "tma ")
                timed = [(v, k) for k, v in row.items() if k.startswith("tma (") and "dev" not in k
                         and isinstance(v, float)]
                if timed:
                    print(f"  TMA kernel: best {min(timed)[1]} {min(timed)[0]:.4f} ms", flush=True)
            rows.append(row)
            best = min((v, k) for k, v in row.items() if k.startswith("(") and "dev" not in k and isinstance(v, float))
            print(f"C {channels} k{taps} d{dilation} {batch}x{frames}: cuDNN {row['cudnn_ms']:.4f} ms, "
                  f"best tile {best[1]} {best[0]:.4f} ms", flush=True)
    # the TMA kernel's tiles as "tma C" (codec_step --conv-tiles reads both kinds)
    chosen = {f"tma {key[1]}" if key[0] == "tma" else str(key): min(by_tile, key=by_tile.get)
              for key, by_tile in totals.items() if by_tile}
    print("TILES =", json.dumps(chosen), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "shapes": args.shapes, "rows": rows,
                       "chosen": chosen}, f, indent=1)


def time_tiles(row: dict, totals: dict, key: tuple, table: dict, table_key, candidates: list, run, want,
               reps: int, prefix: str = "") -> None:
    """Each candidate tile put in `table[table_key]` in turn (the table as it was after): `run()`'s time and its
    deviation from `want` into `row` (named `prefix` + the tile), its time summed into `totals[key]` (a tile whose
    output deviates counts as never fastest)."""
    served = table.get(table_key)
    for tile in candidates:
        table[table_key] = tile
        name = f"{prefix}{tile}"
        try:
            got = run()
            error = ((got.float() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
            ms = time_ms(run, reps)
        except Exception as exc:  # e.g. a tile past the shared memory: that tile is out for this conv
            row[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
            continue
        row[name] = round(ms, 4)
        row[f"{name} rms deviation"] = round(error, 5)
        totals.setdefault(key, {}).setdefault(tile, 0.0)
        totals[key][tile] += ms if error < 0.05 else float("inf")
    table.pop(table_key, None)
    if served:
        table[table_key] = served

if __name__ == "__main__":
    main()
