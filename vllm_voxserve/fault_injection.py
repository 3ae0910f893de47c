"""Faults injected on purpose, for tests only: they prove that one request's failure ends that request alone.

Off unless the server's own environment sets `VOXSERVE_TEST_FAULT` (a client cannot reach it):
`STAGE:SEED[:FRAME]` makes the worker raise while it serves the request whose seed is SEED, at STAGE:
- `start`: while it takes the request up (its prefill set-up);
- `step`: while it writes the request's rows of a step, once the request has FRAME frames (default 0);
- `send`: while it hands a chunk of the request's audio to the audio channel.
`VOXSERVE_TEST_SLOW_REFERENCE_S=SECONDS` makes every reference-clip encoding take that much longer (Base).
`VOXSERVE_TEST_REFUSE=RANK:SEED` makes the scheduler of data-parallel rank RANK refuse the request whose seed is SEED
on arrival, as its capacity model refuses one it has no room for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

FAULT_ENV = "VOXSERVE_TEST_FAULT"
SLOW_REFERENCE_ENV = "VOXSERVE_TEST_SLOW_REFERENCE_S"
REFUSE_ENV = "VOXSERVE_TEST_REFUSE"
STAGES = ("start", "step", "send")


class InjectedFault(RuntimeError):
    """Raised where a test asked for a fault."""


@dataclass(frozen=True)
class FaultPlan:
    stage: str
    seed: int
    frame: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultPlan | None:
        value = environ.get(FAULT_ENV, "").strip()
        if not value:
            return None
        parts = value.split(":")
        if len(parts) not in (2, 3) or parts[0] not in STAGES:
            raise ValueError(f"{FAULT_ENV} must be STAGE:SEED[:FRAME] with STAGE one of {STAGES}, got {value!r}")
        return cls(parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 0)

    def check(self, stage: str, seed: int | None, frame: int = 0) -> None:
        if stage == self.stage and seed == self.seed and frame >= self.frame:
            raise InjectedFault(f"injected {stage} fault (seed {seed}, frame {frame})")


def slow_reference_delay(environ: Mapping[str, str] = os.environ) -> float:
    """Extra seconds each reference-clip encoding takes (0 unless a test sets `VOXSERVE_TEST_SLOW_REFERENCE_S`)."""
    value = environ.get(SLOW_REFERENCE_ENV, "").strip()
    return float(value) if value else 0.0


def sleep_if_slowed(environ: Mapping[str, str] = os.environ) -> None:
    delay = slow_reference_delay(environ)
    if delay > 0:
        time.sleep(delay)


@dataclass(frozen=True)
class RefusalPlan:
    rank: int
    seed: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RefusalPlan | None:
        value = environ.get(REFUSE_ENV, "").strip()
        if not value:
            return None
        parts = value.split(":")
        if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise ValueError(f"{REFUSE_ENV} must be RANK:SEED, got {value!r}")
        return cls(int(parts[0]), int(parts[1]))

    def refuses(self, rank: int, seed: int | None) -> bool:
        return rank == self.rank and seed == self.seed
