"""The serving sizes a plain `vllm serve MODEL --plugin voxserve` runs with, derived from the device and the model.

Pure: no torch, no vLLM. The config hook gathers the facts (SM count, memory, model size) and applies the result
where the user left a setting out; an explicit setting always wins.

Anchor: the H200 (132 SMs, 141 GB) served its best measured configuration with 384 decode rows, `--max-num-seqs`
384 and 512 codec state slots (benchmarks/results/h200/2026-12-02_78cd88a: 120 req/s at 99.73 %). Elsewhere, rows
scale with the SMs (a decode step's time grows with rows per SM) and are capped by what the memory left after the
weights can hold; slots stay a third above the rows, so finished requests whose last chunks are still decoding do
not hold back admission. A CPU serves few streams: it keeps small sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30

ANCHOR_SMS = 132  # the H200's, where ANCHOR_ROWS were measured
ANCHOR_ROWS = 384
FULL_SIZE_MIN_SMS = 120  # from here on a GPU gets the anchor's rows (not measured beyond them)
H200_SEED_MIN_BYTES = 100 * (1 << 30)  # with FULL_SIZE_MIN_SMS: an H200-class GPU, whose measured costs seed the model
MIN_GPU_ROWS = 32
ROW_QUANTUM = 32  # rows come in multiples of this (the backbone's graph sizes step by 8 and 16 there)
CPU_ROWS = 128  # vLLM's own CPU default for an API server
# Memory one decode row needs beside the weights, assumed: the talker's KV cache for ≈ 400 positions (28 layers,
# 8 KV heads of 128, bf16: 112 KiB a position, 45 MB) plus its codec state and activations, rounded up.
ROW_BYTES = 64 * (1 << 20)
# Memory kept off the rows: vLLM's default gpu_memory_utilization (0.9), and the codec's executables, CUDA graphs
# and compile workspaces (assumed 8 GiB).
MEMORY_UTILIZATION = 0.9
RESERVED_BYTES = 8 * GiB
DEFAULT_MODEL_PARAMS = 2_000_000_000  # Qwen3-TTS 1.7B with its code predictor, when the size is not known
WEIGHT_BYTES_PER_PARAM = 2  # bf16


@dataclass(frozen=True, slots=True)
class ServingDefaults:
    max_num_seqs: int  # vLLM's running cap
    max_decode_batch: int  # voxserve.scheduler.max_decode_batch
    max_codec_slots: int  # voxserve.max_codec_slots
    why: str  # one line for the start-up log
    cost_seed: str = "paper_h100"  # voxserve.scheduler.cost_seed

    def describe(self) -> str:
        return (f"max_num_seqs {self.max_num_seqs}, scheduler.max_decode_batch {self.max_decode_batch}, "
                f"max_codec_slots {self.max_codec_slots}, scheduler.cost_seed {self.cost_seed} ({self.why})")


def _round_down(value: float, quantum: int) -> int:
    return int(value // quantum) * quantum


def slots_for(rows: int) -> int:
    """Codec state slots for `rows` decode rows: a third more, in whole quanta (384 -> 512)."""
    return max(_round_down(rows * 4 / 3 + ROW_QUANTUM - 1, ROW_QUANTUM), rows)


def derive_serving_defaults(
    device_kind: str, sm_count: int | None = None, memory_bytes: int | None = None, model_params: int | None = None
) -> ServingDefaults:
    """`device_kind`: "cuda" for an NVIDIA GPU, anything else is served small (CPU). `sm_count` / `memory_bytes` /
    `model_params`: None where unknown (a GPU of unknown SMs is taken as the anchor's; unknown memory does not cap)."""
    if device_kind != "cuda":
        return ServingDefaults(CPU_ROWS, CPU_ROWS, slots_for(CPU_ROWS), f"device {device_kind}")
    reasons = []
    if sm_count is None or sm_count >= FULL_SIZE_MIN_SMS:
        rows = ANCHOR_ROWS
        reasons.append(f"{sm_count if sm_count is not None else 'unknown'} SMs")
    else:
        rows = max(_round_down(ANCHOR_ROWS * sm_count / ANCHOR_SMS, ROW_QUANTUM), MIN_GPU_ROWS)
        reasons.append(f"{sm_count} SMs: {ANCHOR_ROWS} rows scaled from {ANCHOR_SMS}")
    if memory_bytes is not None:
        weights = (model_params or DEFAULT_MODEL_PARAMS) * WEIGHT_BYTES_PER_PARAM
        spare = memory_bytes * MEMORY_UTILIZATION - weights - RESERVED_BYTES
        memory_rows = max(_round_down(spare / ROW_BYTES, ROW_QUANTUM), MIN_GPU_ROWS)
        if memory_rows < rows:
            rows = memory_rows
            reasons.append(f"{memory_bytes / GiB:.0f} GiB holds {memory_rows} rows beside {weights / GiB:.1f} GiB "
                           "of weights")
        else:
            reasons.append(f"{memory_bytes / GiB:.0f} GiB")
    large = (sm_count or 0) >= FULL_SIZE_MIN_SMS and (memory_bytes or 0) >= H200_SEED_MIN_BYTES
    return ServingDefaults(rows, rows, slots_for(rows), "GPU, " + ", ".join(reasons),
                           "h200" if large else "paper_h100")


def cores_per_sm(major: int, minor: int) -> int | None:
    """FP32 cores per SM by compute capability, to turn NVML's core count into SMs (NVML has no SM count)."""
    if major in (7,) or (major, minor) == (8, 0):
        return 64
    if major >= 8:
        return 128
    return None


def is_vllm_default(value: int | None, default_caps: set[int]) -> bool:
    """Whether a running cap is vLLM's own default rather than the user's `--max-num-seqs`: vLLM fills the field in
    before the config hook runs and keeps no mark of who set it, so a value among its defaults (`default_caps`) is
    taken as unset. A user who passes exactly vLLM's default gets the derived cap instead."""
    return value is None or value in default_caps
