"""The code predictor as the served model step runs it: on the step's decode rows, from the persistent step buffers.

Two ways to run, one computation (`_compute`, which calls `FusedCodePredictor.frame`):
- inside a CUDA graph vLLM is capturing (its FULL decode graphs): inline, on every row a decode step can have;
- otherwise (eager and PIECEWISE steps, where vLLM runs our forward's Python each step): replay our own CUDA graph
  for the smallest batch bucket that holds the step's decode rows, so a mixed prefill/decode step costs one launch.
On GPU the frame's two repeated pieces are torch.compile'd with a dynamic batch dimension (batches are at least 2
rows: a batch of one would be specialised), before any capture; our graphs are captured at the first eager forward (vLLM's profile
run), into one memory pool. On CPU everything runs eagerly.
"""

from __future__ import annotations

import logging
import time

import torch

from vllm_voxserve.models.batch_sizes import powers_of_two_up_to, smallest_at_least

from .fused_code_predictor import FusedCodePredictor
from .step_buffers import StepBuffers

logger = logging.getLogger(__name__)


class ServedCodePredictor:
    def __init__(self, fused: FusedCodePredictor, buffers: StepBuffers, vocab_size: int, compile: bool,
                 graphs: bool):
        self.fused, self.buffers, self.vocab_size = fused, buffers, vocab_size
        cuda = buffers.stash.device.type == "cuda"
        if compile and cuda:
            fused.compile()
        self.use_graphs = graphs and cuda
        self.buckets = tuple(b for b in powers_of_two_up_to(buffers.max_decode_rows) if b >= 2)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def run(self, input_ids: torch.Tensor, num_decode_rows: int) -> int:
        """Codebooks 1..15 of this step's decode rows into `buffers.cp_codes[:k]`, codebook 0 into `cp_c0[:k]`, for
        the rows `buffers.decode_row_index[:k]` (the real ones first, then repeats of the first); returns k.

        num_decode_rows: the step's real decode rows (host-known; 0 in vLLM's dummy runs)."""
        buf, n = self.buffers, input_ids.shape[0]
        capturing = self.use_graphs and torch.cuda.is_current_stream_capturing()
        if self.use_graphs and not capturing:
            if not self.graphs:
                self._capture()
            k = smallest_at_least(self.buckets, max(num_decode_rows, 2))
        else:  # the rows a step of n tokens can have, fixed by n (so vLLM's graph per n stays valid)
            k = max(2, min(n, buf.max_decode_rows))
        rows = buf.decode_row_index[:k].clamp(max=n - 1)  # dummy runs may find stale indices
        buf.cp_c0[:k].copy_(input_ids.index_select(0, rows).clamp(0, self.vocab_size - 1))
        if self.use_graphs and not capturing:
            self.graphs[k].replay()
        else:
            self._compute(k)
        return k

    def _compute(self, k: int) -> None:
        buf = self.buffers
        rows = buf.decode_row_index[:k]
        hidden = buf.stash.index_select(0, buf.read_slot.index_select(0, rows))
        args = [t.index_select(0, rows) for t in (buf.cp_temperature, buf.cp_top_k, buf.cp_top_p, buf.seed,
                                                   buf.frame_index)]
        buf.cp_codes[:k].copy_(self.fused.frame(hidden, buf.cp_c0[:k], *args))

    def _capture(self) -> None:
        started = time.perf_counter()
        for k in self.buckets:  # compiles on the first call, then warms every bucket up
            self._compute(k)
        torch.cuda.synchronize()
        compiled = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        # a graph runs at the priority of the stream it was captured on: the backbone's (`lanes.backbone_priority`)
        stream = torch.cuda.Stream(priority=torch.cuda.current_stream().priority)
        for k in sorted(self.buckets, reverse=True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._compute(k)
            self.graphs[k] = graph
        torch.cuda.synchronize()
        logger.info("code predictor: compiled/warmed in %.1f s, %d CUDA graphs (batches %s) captured in %.1f s",
                    compiled - started, len(self.graphs), list(self.buckets), time.perf_counter() - compiled)
