"""Send streaming speech requests (alone, then concurrently) and record time to first audio and length."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time

import requests

SAMPLES_PER_FRAME, HEADER = 1920, 44


def one(url: str, model: str, tokens: int, seed: int) -> dict:
    body = {"model": model, "input": "The quick brown fox jumps over the lazy dog.", "voice": "ryan", "stream": True,
            "response_format": "wav", "max_new_tokens": tokens, "ignore_eos": True, "seed": seed}
    start = time.monotonic()
    first, size, arrivals = None, 0, []
    with requests.post(f"{url}/v1/audio/speech", json=body, stream=True, timeout=600) as r:
        status = r.status_code
        for chunk in r.iter_content(None):
            size += len(chunk)
            if first is None and size > HEADER:
                first = time.monotonic() - start
            arrivals.append(round(time.monotonic() - start, 4))
    audio_s = (size - HEADER) / 2 / 24000
    return {"status": status, "ttfa_s": first, "total_s": time.monotonic() - start, "audio_s": audio_s,
            "frames": (size - HEADER) // 2 // SAMPLES_PER_FRAME, "arrivals": arrivals[:50]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=101)
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64])
    args = p.parse_args()
    results = {"warmup": one(args.url, args.model, 21, 0)}
    for n in args.concurrency:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            runs = list(pool.map(lambda i: one(args.url, args.model, args.tokens, i), range(n)))
        ttfa = sorted(r["ttfa_s"] for r in runs if r["ttfa_s"] is not None)
        results[f"concurrent_{n}"] = {"runs": runs, "ok": sum(r["status"] == 200 for r in runs),
                                      "ttfa_median_s": ttfa[len(ttfa) // 2] if ttfa else None,
                                      "ttfa_max_s": ttfa[-1] if ttfa else None}
        print(n, "ok", results[f"concurrent_{n}"]["ok"], "ttfa median", results[f"concurrent_{n}"]["ttfa_median_s"],
              "max", results[f"concurrent_{n}"]["ttfa_max_s"], "total max", max(r["total_s"] for r in runs))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
