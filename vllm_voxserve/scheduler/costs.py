"""Cost estimates for the LM lane and the two codec lanes, seeded from the paper and corrected by measurements.

Each cost is a line `fixed_s + per_item_s * size`. Measured samples (`report.CostSample`) move a per-kind correction
factor (an exponential moving average of measured / predicted), so the shape comes from the seed and the scale from
the running server.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_voxserve.contract import COST_KINDS, CostSample


@dataclass(frozen=True, slots=True)
class LinearCost:
    fixed_s: float
    per_item_s: float

    def __call__(self, size: int) -> float:
        return self.fixed_s + self.per_item_s * max(size, 1)

    @classmethod
    def through(cls, size_a: int, seconds_a: float, size_b: int, seconds_b: float) -> "LinearCost":
        per_item = (seconds_b - seconds_a) / (size_b - size_a)
        return cls(seconds_a - per_item * size_a, per_item)


@dataclass(frozen=True, slots=True)
class CostSeed:
    decode: LinearCost  # one LM step on the LM partition, by decode batch
    prefill: LinearCost  # one prefill on the whole GPU, by prompt tokens
    urgent_codec: LinearCost  # whole GPU, by chunks
    background_codec: LinearCost  # codec partition beside the backbone, by chunks


def paper_h100_seed(codec_sms: int = 32) -> CostSeed:
    """Qwen3-TTS on one H100 with the 100/32 split.

    Codec (paper §2.3, O3): 1.9 ms for 1 chunk and 10 ms for 16 on the whole GPU; 5.0 ms and 49 ms on 24 SMs beside
    the backbone. The paper gives no 32-SM figure: the 24-SM line is scaled by 24 / codec_sms (assumed compute-bound;
    at 24 SMs a lane would deliver only ≈ 330 chunks/s, short of the ≈ 490 chunks/s of 48 req/s, which the paper's
    100/32 split serves).

    LM step, derived (the paper gives no step time):
    - past capacity the prefill-first LM completes 48 req/s (§4.7), so one request costs ≈ 20.8 ms of LM time;
    - a request is 7.8 s of audio on average (§4.1), 97.5 frames of 80 ms;
    - prefills are packed (its prefill graphs take 256–2048 tokens, several ≈ 40-token prompts), so a saturated LM
      spends ≈ 0.9 ms of prefill per request (8 prompts in one 7.2 ms prefill, by the prefill line below);
    - with full decode batches of 64 (assumed: the paper names no maximum; its baselines ran 64),
      20.8 ms = 0.9 ms + 97.5 * t(64) / 64 gives t(64) ≈ 13.1 ms;
    - the step is launch-bound (notes/qwen3-tts.md measured the depth predictor alone at 9.0 ms for batch 1 and
      9.2 ms for batch 64 on an H200), so t(1) is taken as 8.6 ms.
    Prefill, assumed: one talker pass over the packed prompts plus one depth-predictor frame, 4 ms + 10 µs per token.
    """
    if codec_sms < 1:
        raise ValueError(f"codec_sms must be >= 1, got {codec_sms}")
    return CostSeed(
        decode=LinearCost.through(1, 8.6e-3, 64, 13.1e-3),
        prefill=LinearCost(4.0e-3, 1.0e-5),
        urgent_codec=LinearCost.through(1, 1.9e-3, 16, 10.0e-3),
        background_codec=LinearCost.through(1, 5.0e-3 * 24 / codec_sms, 16, 49.0e-3 * 24 / codec_sms),
    )


def h200_seed() -> CostSeed:
    """Qwen3-TTS 1.7B on one H200 (132 SMs) with 64 codec SMs and the backbone at high stream priority, as served
    at 120 req/s in benchmarks/results/h200/2026-12-02_78cd88a.

    - Decode, on the whole GPU beside a busy background codec lane: 12.1-12.4 ms for 160-174 rows in the served
      step log, 12.7 ms for 192 rows side by side (run 1): the line through (167, 12.25 ms) and (192, 12.7 ms).
      Assumed to hold up to 384 rows (not measured past 192); alone the step is faster (9.5 ms at 192), which this
      line leaves out: the backbone is taken as always beside a busy codec lane, its state near capacity.
    - Background codec, 64 SMs beside the backbone: 64 chunks of 10 frames in 45.6 ms under full contention (run 1;
      28 ms alone); 4 chunks assumed 6 ms (2.1 ms on the whole GPU, run 2026-12-02_f0a91d7, scaled by the partition
      and the contention). The lane then tops out near 14,000 frames/s, as run 1 measured (14,043).
    - Urgent codec, whole GPU at the greatest priority: 1.7 ms for 1 chunk, 4 ms for 8 (run 2026-12-02_f0a91d7's
      2.1 ms for 4 chunks on the whole GPU lies on that line).
    - Prefill: what packed prompts add to the step their running requests decode in (CostModel.observe counts it
      so): 1.5 ms + 10 us per prompt token, assumed from run 2026-12-02_f0a91d7's step log, where steps with prompts
      took 14-16 ms against about 13-14 for decode steps of the same batch.
    """
    return CostSeed(
        decode=LinearCost.through(167, 12.25e-3, 192, 12.7e-3),
        prefill=LinearCost(1.5e-3, 1.0e-5),
        urgent_codec=LinearCost.through(1, 1.7e-3, 8, 4.0e-3),
        background_codec=LinearCost.through(4, 6.0e-3, 64, 45.6e-3),
    )


def seed_named(name: str, codec_sms: int) -> CostSeed:
    """The seed of `SchedulerPolicyConfig.cost_seed`: "paper_h100" (its codec line scaled to `codec_sms`) or "h200"
    (measured with 64 codec SMs)."""
    if name == "h200":
        return h200_seed()
    if name == "paper_h100":
        return paper_h100_seed(codec_sms)
    raise ValueError(f"unknown cost seed {name!r}")


class CostModel:
    """Estimates in seconds; `observe` folds in what the worker measured."""

    def __init__(self, seed: CostSeed | None = None, smoothing: float = 0.1) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.seed = seed or paper_h100_seed()
        self.smoothing = smoothing
        self.correction = dict.fromkeys(COST_KINDS, 1.0)

    def _seed_line(self, kind: str) -> LinearCost:
        return getattr(self.seed, kind)

    def estimate(self, kind: str, size: int) -> float:
        return self._seed_line(kind)(size) * self.correction[kind]

    def observe(self, sample: CostSample) -> None:
        seconds = sample.seconds
        if sample.kind == "prefill" and sample.decode_rows:
            # what the prefill adds to the step its running requests decode in. Counted whole, a prefill "took" the
            # step's 14-16 ms on the H200, as long as a decode step of about the same batch (run 2026-12-02_f0a91d7
            # step log), and the deadline-aware rule deferred prefills against slack they barely touch
            seconds = max(seconds - self.decode_step_s(sample.decode_rows), 0.0)
        predicted = self._seed_line(sample.kind)(sample.size)
        ratio = seconds / predicted if predicted > 0 else 1.0
        old = self.correction[sample.kind]
        self.correction[sample.kind] = old + self.smoothing * (ratio - old)

    def decode_step_s(self, batch: int) -> float:
        return self.estimate("decode", batch)

    def prefill_s(self, tokens: int) -> float:
        return self.estimate("prefill", tokens)

    def urgent_codec_s(self, chunks: int) -> float:
        return self.estimate("urgent_codec", chunks)

    def background_codec_s(self, chunks: int) -> float:
        return self.estimate("background_codec", chunks)
