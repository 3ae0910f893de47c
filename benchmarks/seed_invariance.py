"""Does a seeded request sound the same alone and in a batch? Per-frame comparison of the returned PCM.

    python -m benchmarks.seed_invariance --base-url http://127.0.0.1:8000 --model qwen3-tts --out seeds.json

Each probe request (sampled, seeded, fixed length) runs alone, then with 7 other requests at once. The API returns
audio, not codes, so frames are compared as 80 ms PCM windows: a frame matches when its relative error is under
`--tolerance` (the bf16 codec rounds differently in other batches; a different code gives an unrelated waveform,
and, the backbone being autoregressive, usually every frame after it differs too). The record keeps each probe's
per-frame errors so other thresholds can be recomputed.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SAMPLES_PER_FRAME = 1920
SAMPLED = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
           "subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0}


def frame_errors(alone: np.ndarray, batched: np.ndarray) -> list[float]:
    """Relative RMS error of each 80 ms frame of `batched` against `alone` (int16 PCM); a missing frame is 1.0."""
    frames = len(alone) // SAMPLES_PER_FRAME
    errors = []
    for f in range(frames):
        a = alone[f * SAMPLES_PER_FRAME:(f + 1) * SAMPLES_PER_FRAME].astype(np.float64)
        b = batched[f * SAMPLES_PER_FRAME:(f + 1) * SAMPLES_PER_FRAME].astype(np.float64)
        if len(b) < len(a):
            errors.append(1.0)
            continue
        errors.append(float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(a ** 2)), 1.0)))
    return errors


def summarize(errors_by_probe: list[list[float]], tolerance: float) -> dict:
    matched = [[e <= tolerance for e in errors] for errors in errors_by_probe]
    frames = sum(len(m) for m in matched)
    prefix = [next((i for i, ok in enumerate(m) if not ok), len(m)) for m in matched]
    return {"probes": len(matched), "frames": frames,
            "frames_matching": sum(sum(m) for m in matched) / max(frames, 1),
            "probes_matching_whole": sum(all(m) for m in matched) / max(len(matched), 1),
            "mean_matching_prefix": sum(p / max(len(m), 1) for p, m in zip(prefix, matched)) / max(len(matched), 1),
            "tolerance": tolerance}


def speak(base_url: str, body: dict) -> np.ndarray:
    request = urllib.request.Request(f"{base_url}/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return np.frombuffer(response.read(), dtype=np.int16)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--voice", default="vivian")
    parser.add_argument("--probes", type=int, default=16)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    def body(i: int, seed: int) -> dict:
        return {"model": args.model, "voice": args.voice, "response_format": "pcm", "ignore_eos": True,
                "input": f"Probe sentence number {i} for the seeded sampling check.", "seed": seed,
                "max_new_tokens": args.frames + 1, **SAMPLED}

    errors = []
    with ThreadPoolExecutor(8) as pool:
        for i in range(args.probes):
            probe = body(i, 1000 + i)
            alone = speak(args.base_url, probe)
            others = [body(100 + 8 * i + j, 50_000 + 8 * i + j) for j in range(7)]
            batch = list(pool.map(lambda b: speak(args.base_url, b), [probe, *others]))
            errors.append(frame_errors(alone, batch[0]))
    record = {"summary": summarize(errors, args.tolerance), "frame_errors": errors, "args": vars(args)}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record["summary"]))


if __name__ == "__main__":
    main()
