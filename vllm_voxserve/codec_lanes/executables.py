"""Executables: one CUDA graph per (batch bucket, frames) on one partition's stream.

`plan()` is host work (fill pinned staging, queue the copies into the static inputs);
`run()` replays the graph (or runs eagerly on CPU / when graphs are off). Graphs are
captured on the partition's green stream, which fixes their SMs, and replayed on its
primary-context launch stream (see partitions.py for why). Graphs of one lane share one
memory pool, over all its executable sets: they never run at the same time, because a
lane's batches run one after another on its stream. Static inputs and outputs are
allocated outside capture, so graphs only hold their scratch in the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_voxserve.models.batch_sizes import smallest_at_least
from vllm_voxserve.models.program import CodecProgram, CodecStatePool


class CodecExecutables:
    """Static buffers and graphs of one lane: decode(codes[B,F,Q], slots[B]) -> wav[B, F*spf]."""

    def __init__(self, program: CodecProgram, pool: CodecStatePool, capture_stream: Any, launch_stream: Any,
                 device: torch.device, buckets: Sequence[int], frame_counts: Sequence[int], padding_slot: int,
                 use_graphs: bool) -> None:
        self.program, self.pool, self.device = program, pool, device
        self.capture_stream = capture_stream
        self.buckets = tuple(sorted(buckets))
        self.frame_counts = tuple(sorted(frame_counts))
        self.use_graphs = use_graphs and device.type == "cuda"
        # where the lane queues its work: graphs replay on the launch stream, eager work stays on the partition
        self.stream = launch_stream if self.use_graphs else capture_stream
        max_b, max_f = self.buckets[-1], self.frame_counts[-1]
        q, spf = program.codes_per_frame, program.samples_per_frame
        pinned = device.type == "cuda"
        self.codes = torch.zeros(max_b, max_f, q, dtype=torch.int64, device=device)
        self.slots = torch.full((max_b,), padding_slot, dtype=torch.int64, device=device)
        self.reset_slots = torch.zeros(max_b, dtype=torch.int64, device=device)
        self.wav = torch.zeros(max_b, max_f * spf, dtype=torch.float32, device=device)
        if pinned:
            self.codes_host = torch.zeros(max_b, max_f, q, dtype=torch.int64, pin_memory=True)
            self.slots_host = torch.full((max_b,), padding_slot, dtype=torch.int64, pin_memory=True)
            self.reset_host = torch.zeros(max_b, dtype=torch.int64, pin_memory=True)
        else:  # on CPU the static buffers are the host buffers
            self.codes_host, self.slots_host, self.reset_host = self.codes, self.slots, self.reset_slots
        self.padding_slot = padding_slot
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.mempool: Any = None  # the graphs' memory pool, once captured

    def keys(self) -> list[tuple[int, int]]:
        return [(b, f) for b in self.buckets for f in self.frame_counts]

    @torch.no_grad()
    def _eager(self, bucket: int, frames: int) -> None:
        wav = self.program.decode(self.codes[:bucket, :frames], self.slots[:bucket], self.pool)
        self.wav[:bucket, :frames * self.program.samples_per_frame].copy_(wav)

    def capture(self, warmup: int = 2, mempool: Any = None) -> None:
        """Warm up on the partition (so library heuristics see it), then capture every key, into `mempool` (another
        set's of the same lane) or a new pool.

        Static slots all point at the padding slot here, so no request's state is touched."""
        if not self.use_graphs:
            return
        self.slots.fill_(self.padding_slot)
        steps = {key: (lambda k=key: self._eager(*k)) for key in self.keys()}
        self.mempool = mempool if mempool is not None else torch.cuda.graph_pool_handle()
        self._graphs = _capture_all(steps, self.capture_stream, warmup, self.mempool)

    def plan(self, codes: Sequence[torch.Tensor], slots: Sequence[int], fresh_slots: Sequence[int],
             frames: int) -> int:
        """Stage one batch (call with the lane's stream current). codes[i] is int64 [f_i, Q] with
        f_i <= frames; rows past f_i and padding rows get code 0. Returns the bucket."""
        n = len(codes)
        bucket = smallest_at_least(self.buckets, n)
        # whole rows only: a strided host<->device copy goes through pageable memory and blocks the host
        self.codes_host[:bucket].zero_()
        on_device = [(i, c) for i, c in enumerate(codes) if c.device.type == "cuda"]
        _stage(self.codes_host, [(i, c) for i, c in enumerate(codes) if c.device.type != "cuda"])
        self.slots_host[:n] = torch.as_tensor(list(slots), dtype=torch.int64)
        self.slots_host[n:bucket] = self.padding_slot
        if self.device.type == "cuda":
            self.codes[:bucket].copy_(self.codes_host[:bucket], non_blocking=True)
            self.slots[:bucket].copy_(self.slots_host[:bucket], non_blocking=True)
        _stage(self.codes, on_device)  # after the host rows' copy, which zeroed these rows
        if fresh_slots:
            k = len(fresh_slots)
            self.reset_host[:k] = torch.as_tensor(list(fresh_slots), dtype=torch.int64)
            if self.device.type == "cuda":
                self.reset_slots[:k].copy_(self.reset_host[:k], non_blocking=True)
            self.pool.reset(self.reset_slots[:k])
        return bucket

    def run(self, bucket: int, frames: int) -> torch.Tensor:
        """Decode the planned batch; returns the static output view [bucket, frames*spf]."""
        graph = self._graphs.get((bucket, frames))
        if graph is not None:
            graph.replay()
        else:
            self._eager(bucket, frames)
        return self.wav[:bucket, :frames * self.program.samples_per_frame]

    def copy_out(self, n: int) -> torch.Tensor:
        """The first n output rows (whole rows, see plan) on the host, the batch's own: on GPU a copy queued into
        fresh page-locked rows from torch's caching host allocator, so the harvest hands the audio on without
        copying it again (a numpy copy of up to 2.4 MB per batch on the engine's thread); on CPU a copy of the
        static rows, which the next run reuses (numpy's: torch fans a copy this big out to its intra-op pool)."""
        if self.device.type == "cuda":
            rows = torch.empty((n, self.wav.shape[1]), dtype=torch.float32, pin_memory=True)
            return rows.copy_(self.wav[:n], non_blocking=True)
        return torch.from_numpy(self.wav[:n].numpy().copy())


def _stage(dest: torch.Tensor, chunks: list[tuple[int, torch.Tensor]]) -> None:
    """Copy each chunk (row i, codes [f, Q]) into row i of `dest`: with one copy when they fill consecutive rows at
    one length (the usual batch), else one copy per chunk."""
    if not chunks:
        return
    first, lengths = chunks[0][0], {c.shape[0] for _, c in chunks}
    if len(lengths) == 1 and [i for i, _ in chunks] == list(range(first, first + len(chunks))):
        dest[first : first + len(chunks), : lengths.pop()].copy_(torch.stack([c for _, c in chunks]))
    else:
        for i, c in chunks:
            dest[i, : c.shape[0]].copy_(c)


def capture_step_graphs(make_step: Callable[[int], Callable[[], Any]], buckets: Sequence[int], stream: Any,
                        warmup: int = 2) -> dict[int, torch.cuda.CUDAGraph]:
    """Capture a per-bucket step (e.g. a backbone decode step) on one partition's stream.

    make_step(bucket) returns a closure over that bucket's static buffers. `stream` is the
    partition's green capture stream; replay the graphs on its primary-context launch stream."""
    return _capture_all({b: make_step(b) for b in buckets}, stream, warmup)


def _capture_all(steps: dict, stream: Any, warmup: int, mempool: Any = None) -> dict:
    """Warm every step up on `stream` (library heuristics then see the partition), then
    capture each on it, largest key first, all into one memory pool (`mempool`, or a new one)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for step in steps.values():
            for _ in range(warmup):
                step()
    stream.synchronize()
    mempool = mempool if mempool is not None else torch.cuda.graph_pool_handle()
    graphs = {}
    for key in sorted(steps, reverse=True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=mempool, stream=stream):
            steps[key]()
        graph.step = steps[key]  # its closure holds the static buffers the graph reads and writes: keep them alive
        graphs[key] = graph
    stream.synchronize()
    return graphs
