"""SM partitions: an LM partition, a disjoint codec partition, and a full-GPU urgent stream.

Driver route (see shared/notes/green-contexts.md): ONE `cuDevSmResourceSplitByCount`
gives a structured group and its remainder, which are disjoint; each becomes a green
context with its own stream. torch 2.11's `GreenContext.create` cannot make disjoint
pairs, so it is not used. The urgent stream lives in the primary context (all SMs) at
the greatest priority.

Graphs: a graph captured on a green-context stream keeps that partition's SMs, but on
the H200 (driver 580) replaying it on a green-context stream silently runs nothing,
while replaying it on a primary-context stream runs it on the partition it was captured
on (measured, see tests/codec_lanes/test_gpu_lanes.py). So each partition has a green
*capture* stream and a primary-context *launch* stream; eager kernels queued on a
launch stream run on the whole GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """How to split the SMs. The side named by `group` gets `group_sms` (rounded up by the
    driver to the hardware's granularity, 8 on Hopper); the other side gets the remainder."""

    group: str = "codec"  # "codec" or "lm"
    group_sms: int = 24
    device_index: int = 0

    def __post_init__(self) -> None:
        if self.group not in ("codec", "lm"):
            raise ValueError(f"group must be 'codec' or 'lm', got {self.group!r}")
        if self.group_sms <= 0:
            raise ValueError(f"group_sms must be positive, got {self.group_sms}")
        if self.device_index < 0:
            raise ValueError(f"device_index must be >= 0, got {self.device_index}")


@dataclass(frozen=True)
class Partitions:
    """Streams of one GPU split. Streams are None on CPU (no partitions, eager work)."""

    device: torch.device
    lm_stream: Any  # green: capture decode graphs (and eager work confined to the LM SMs)
    codec_stream: Any  # green: capture background codec graphs
    lm_launch_stream: Any  # primary context: replay LM-partition graphs
    codec_launch_stream: Any  # primary context: replay codec-partition graphs
    full_stream: Any  # prefill, whole GPU, normal priority
    urgent_stream: Any  # urgent codec lane, whole GPU, greatest priority (capture and replay)
    lm_sms: int
    codec_sms: int
    total_sms: int
    _owner: Any = None  # keeps green contexts and raw streams alive

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()


def cpu_partitions() -> Partitions:
    """The no-op variant: one device, no streams, no SM counts."""
    return Partitions(torch.device("cpu"), None, None, None, None, None, None, 0, 0, 0)


def _ok(result):
    from cuda.bindings import driver as drv

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class _DriverObjects:
    """Owns the green contexts and raw streams; destroys streams before contexts."""

    def __init__(self) -> None:
        self.green_ctxs: list = []
        self.streams: list = []

    def close(self) -> None:
        from cuda.bindings import driver as drv

        torch.cuda.synchronize()
        for s in self.streams:
            drv.cuStreamDestroy(s)
        for g in self.green_ctxs:
            drv.cuGreenCtxDestroy(g)
        self.streams, self.green_ctxs = [], []


def create_partitions(spec: SplitSpec) -> Partitions:
    """Split one GPU into LM and codec green contexts and make the four streams."""
    from cuda.bindings import driver as drv

    device = torch.device("cuda", spec.device_index)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # the primary context exists and is current
    sm_type = drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    dev = _ok(drv.cuDeviceGet(spec.device_index))
    full = _ok(drv.cuDeviceGetDevResource(dev, sm_type))
    if spec.group_sms >= full.sm.smCount:
        raise ValueError(f"group_sms {spec.group_sms} leaves no SMs of {full.sm.smCount}")
    groups, _, remainder = _ok(drv.cuDevSmResourceSplitByCount(1, full, 0, spec.group_sms))
    group = groups[0] if isinstance(groups, (list, tuple)) else groups
    codec_res, lm_res = (group, remainder) if spec.group == "codec" else (remainder, group)

    owner = _DriverObjects()
    non_blocking = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
    least, greatest = _ok(drv.cuCtxGetStreamPriorityRange())

    def green_stream(res, priority: int):
        desc = _ok(drv.cuDevResourceGenerateDesc([res], 1))
        flags = drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        gctx = _ok(drv.cuGreenCtxCreate(desc, dev, flags))
        owner.green_ctxs.append(gctx)
        granted = _ok(drv.cuGreenCtxGetDevResource(gctx, sm_type)).sm.smCount
        raw = _ok(drv.cuGreenCtxStreamCreate(gctx, non_blocking, priority))
        owner.streams.append(raw)
        return torch.cuda.ExternalStream(int(raw), device=device), granted

    def primary_stream(priority: int):
        raw = _ok(drv.cuStreamCreateWithPriority(non_blocking, priority))
        owner.streams.append(raw)
        return torch.cuda.ExternalStream(int(raw), device=device)

    lm_stream, lm_sms = green_stream(lm_res, least)
    codec_stream, codec_sms = green_stream(codec_res, least)
    parts = Partitions(
        device=device,
        lm_stream=lm_stream,
        codec_stream=codec_stream,
        lm_launch_stream=primary_stream(least),
        codec_launch_stream=primary_stream(least),
        full_stream=primary_stream(least),
        urgent_stream=primary_stream(greatest),
        lm_sms=lm_sms,
        codec_sms=codec_sms,
        total_sms=full.sm.smCount,
        _owner=owner,
    )
    logger.info(
        "SM partitions on %s: LM %d SMs, codec %d SMs (of %d; asked %s=%d); urgent stream priority %d",
        device, lm_sms, codec_sms, full.sm.smCount, spec.group, spec.group_sms, greatest,
    )
    return parts


_SHARED: dict[SplitSpec, Partitions] = {}


def shared_partitions(spec: SplitSpec) -> Partitions:
    """One split per spec in this process: the worker's LM-partition capture and the codec lanes must use the same
    green contexts (the lanes' codec partition is the complement of the LM partition the backbone was captured on)."""
    if spec not in _SHARED:
        _SHARED[spec] = create_partitions(spec)
    return _SHARED[spec]

