"""The LM lane: backbone decode steps on the LM partition, prefill on the whole GPU.

vLLM's runner does the work; this lane only chooses the stream each step runs on and
keeps steps in order across the two streams (an event from the last step is waited on
whenever the stream changes). Capture decode graphs under `capturing()` (the LM
partition's green stream), which fixes them to the LM SMs; replay them under
`step(prefill=False)` (the LM launch stream, primary context: graphs replayed on a green
stream do not run, see partitions.py). Eager kernels of a decode step run on all SMs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from vllm_voxserve.codec_lanes.partitions import Partitions


class LmLane:
    def __init__(self, partitions: Partitions) -> None:
        self.partitions = partitions
        self._last_stream: Any = None
        self._last_done: Any = None

    def stream_for(self, prefill: bool) -> Any:
        return self.partitions.full_stream if prefill else self.partitions.lm_launch_stream

    @contextmanager
    def step(self, prefill: bool) -> Iterator[Any]:
        """Make the step's stream current for the body; yields it (None on CPU)."""
        stream = self.stream_for(prefill)
        if stream is None:
            yield None
            return
        if self._last_stream is None:
            stream.wait_stream(torch.cuda.current_stream(self.partitions.device))
        elif self._last_stream is not stream:
            stream.wait_event(self._last_done)
        with torch.cuda.stream(stream):
            yield stream
        self._last_done = torch.cuda.Event()
        self._last_done.record(stream)
        self._last_stream = stream

    def capturing(self):
        """Context for capturing decode graphs on the LM partition's stream."""
        stream = self.partitions.lm_stream
        return nullcontext() if stream is None else torch.cuda.stream(stream)
