"""Tile sizes of the codec's TMA conv kernel (codec/tma_conv.py) for each residual-unit k7 conv of the served decoder.

    python -m benchmarks.codec_conv_tiles --shapes 64x10,16x10,4x5 --out tiles.json

For every k7 conv a residual unit runs (dilations 1, 3 and 9 at 768, 384, 192 and 96 channels; the served decoder
makes the 768-channel dilated ones matmuls, but they are timed too) and every (chunks x frames) shape, the kernel's
time with each of CANDIDATES (input time-major, as the decoder makes it), and cuDNN's conv1d of the same shape beside
it. Prints the tile with the least total time over the shapes for each channel count: `tma_conv.TILES`.
One GPU, bf16, CUDA events over repeated calls (each call is 0.01-2 ms of device work).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn import functional as F

from vllm_voxserve.models.qwen3_tts.codec import tma_conv
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig

# (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages): tma_conv.TILES; a BLOCK_C that does not divide the channels is
# skipped
CANDIDATES = [(128, 128, 32, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
                  (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 256, 64, 8, 3), (128, 128, 32, 4, 5)]


def residual_convs(config: CodecDecoderConfig) -> list[tuple[int, int, int, int]]:
    """(channels, taps, dilation, output columns per frame) of the residual-unit convs of a decoder."""
    convs, columns = [], 4  # the vocoder's input: 4 columns a frame after the two x2 upsamplers
    for i, rate in enumerate(config.upsample_rates):
        channels, columns = config.decoder_dim // 2 ** (i + 1), columns * rate
        convs += [(channels, 7, dilation, columns) for dilation in (1, 3, 9)]
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
    ap.add_argument("--out")
    args = ap.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    rows, totals = [], {}
    for channels, taps, dilation, per_frame in residual_convs(CodecDecoderConfig()):
        for batch, frames in shapes:
            g = torch.Generator(device="cuda").manual_seed(channels)
            length = frames * per_frame

            def make(*shape, scale=1.0):
                return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

            x = make(batch, channels, length + (taps - 1) * dilation)
            w = make(channels, channels, taps, scale=(channels * taps) ** -0.5)
            w = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # tap-major, as serve_conv_forms stores it
            b = make(channels)
            row = {"channels": channels, "taps": taps, "dilation": dilation, "batch": batch, "frames": frames,
                   "cudnn_ms": time_ms(lambda: F.conv1d(x, w, b, dilation=dilation), args.reps)}
            want = F.conv1d(x.float(), w.float(), b.float(), dilation=dilation)
            x_tm = x.transpose(1, 2).contiguous()
            time_tiles(row, totals, channels, tma_conv.TILES, channels,
                       [t for t in CANDIDATES if channels % t[2] == 0],
                       lambda: tma_conv.tma_conv_triton(x_tm, w, b, dilation), want, args.reps)
            rows.append(row)
            timed = [(v, k) for k, v in row.items() if k.startswith("(") and "dev" not in k and isinstance(v, float)]
            best = f"best tile {min(timed)[1]} {min(timed)[0]:.4f} ms" if timed else "no tile ran"
            print(f"C {channels} k{taps} d{dilation} {batch}x{frames}: cuDNN {row['cudnn_ms']:.4f} ms, {best}",
                  flush=True)
    # by channel count (codec_step --conv-tiles reads them)
    chosen = {str(key): min(by_tile, key=by_tile.get) for key, by_tile in totals.items() if by_tile}
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
